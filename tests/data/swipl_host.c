/* swipl without tcmalloc: SWI-Prolog's own main over libswipl, for the sanitizers and valgrind. */
#include <SWI-Prolog.h>

int main(int argc, char **argv) {
    if (!PL_initialise(argc, argv))
        PL_halt(1);
    PL_halt(PL_toplevel() ? 0 : 1);
    return 0;
}
