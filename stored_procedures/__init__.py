"""The SKB's library of stored procedures (Prolog files), shipped with the package.

The SKB loads every ``*.pl`` file of this folder at start; see
cod.skb.session.library_dir.  ``examples/`` holds procedures applications
push themselves (the paper's cost function)."""
