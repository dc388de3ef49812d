"""`cod shell`: the admin shell for looking into the SKB and the RM (docs/shell.md)."""
