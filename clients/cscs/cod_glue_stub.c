/* Stand-in for cod_glue.c in builds without the COD client library
 * (GLUE=stub, and the C unit tests): --socket is refused with a message.
 * The Makefile links cod_glue.c over libcod whenever libcod can be built. */
#include "cod_glue.h"

#include <stdio.h>

struct cod_glue {
    int unused;
};

int cod_glue_open(const struct glue_config *cfg, struct cod_glue **out, int **cpus,
                  size_t *ncpus, char *err, size_t errlen)
{
    *out = NULL;
    *cpus = NULL;
    *ncpus = 0;
    if (cfg->socket == NULL)
        return 0;
    snprintf(err, errlen,
             "--socket %s: this cscs was built without libcod (the COD client library), "
             "so it cannot talk to the Resource Manager; run without --socket", cfg->socket);
    return -1;
}

int cod_glue_poll(struct cod_glue *g, const struct plan_part *cur, size_t ncur,
                  struct plan *plan, char *err, size_t errlen)
{
    (void)g, (void)cur, (void)ncur, (void)plan, (void)err, (void)errlen;
    return 0;
}

void cod_glue_applied(struct cod_glue *g, int ok)
{
    (void)g, (void)ok;
}

void cod_glue_close(struct cod_glue *g)
{
    (void)g;
}
