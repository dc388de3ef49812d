#include "schema.h"

#include <string.h>

const struct cscs_attr cscs_schema[CSCS_NATTR] = {
    { "id", CSCS_I64, 8, 0 },
    { "key", CSCS_I64, 8, 8 },
    { "i02", CSCS_I32, 4, 16 },
    { "i03", CSCS_I32, 4, 20 },
    { "i04", CSCS_I32, 4, 24 },
    { "i05", CSCS_I32, 4, 28 },
    { "i06", CSCS_I32, 4, 32 },
    { "i07", CSCS_I32, 4, 36 },
    { "i08", CSCS_I32, 4, 40 },
    { "i09", CSCS_I32, 4, 44 },
    { "i10", CSCS_I32, 4, 48 },
    { "i11", CSCS_I32, 4, 52 },
    { "i12", CSCS_I32, 4, 56 },
    { "i13", CSCS_I32, 4, 60 },
    { "i14", CSCS_I32, 4, 64 },
    { "i15", CSCS_I32, 4, 68 },
    { "i16", CSCS_I32, 4, 72 },
    { "i17", CSCS_I32, 4, 76 },
    { "i18", CSCS_I32, 4, 80 },
    { "i19", CSCS_I32, 4, 84 },
    { "i20", CSCS_I32, 4, 88 },
    { "i21", CSCS_I32, 4, 92 },
    { "i22", CSCS_I32, 4, 96 },
    { "i23", CSCS_I32, 4, 100 },
    { "i24", CSCS_I32, 4, 104 },
    { "i25", CSCS_I32, 4, 108 },
    { "i26", CSCS_I32, 4, 112 },
    { "i27", CSCS_I32, 4, 116 },
    { "i28", CSCS_I32, 4, 120 },
    { "i29", CSCS_I32, 4, 124 },
    { "i30", CSCS_I32, 4, 128 },
    { "i31", CSCS_I32, 4, 132 },
    { "l32", CSCS_I64, 8, 136 },
    { "l33", CSCS_I64, 8, 144 },
    { "l34", CSCS_I64, 8, 152 },
    { "l35", CSCS_I64, 8, 160 },
    { "l36", CSCS_I64, 8, 168 },
    { "l37", CSCS_I64, 8, 176 },
    { "l38", CSCS_I64, 8, 184 },
    { "c39", CSCS_CHAR, 3, 192 },
    { "c40", CSCS_CHAR, 3, 195 },
    { "c41", CSCS_CHAR, 8, 198 },
    { "c42", CSCS_CHAR, 8, 206 },
    { "c43", CSCS_CHAR, 15, 214 },
    { "c44", CSCS_CHAR, 15, 229 },
    { "c45", CSCS_CHAR, 20, 244 },
    { "c46", CSCS_CHAR, 20, 264 },
    { "c47", CSCS_CHAR, 31, 284 },
};

uint64_t cscs_splitmix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

uint64_t cscs_seed_hash(uint64_t seed)
{
    return cscs_splitmix64(seed);
}

uint64_t cscs_nkeys(uint64_t ntuples)
{
    uint64_t k = ntuples / CSCS_TUPLES_PER_KEY;
    return k ? k : 1;
}

/* One 64-bit hash per (tuple, slot); slot = attribute * 4 + chunk, so a
 * character attribute can draw up to four hashes (12 characters each). */
static inline uint64_t mix(uint64_t seedh, uint64_t id, unsigned slot)
{
    return cscs_splitmix64(seedh + (id << 8) + slot);
}

uint64_t cscs_key_of(uint64_t seedh, uint64_t nkeys, uint64_t id)
{
    return mix(seedh, id, CSCS_ATTR_KEY * 4) % nkeys;
}

void cscs_gen_value(uint64_t seedh, uint64_t nkeys, uint64_t id, int attr, void *out)
{
    const struct cscs_attr *a = &cscs_schema[attr];
    if (attr == CSCS_ATTR_ID) {
        int64_t v = (int64_t)id;
        memcpy(out, &v, sizeof v);
    } else if (attr == CSCS_ATTR_KEY) {
        int64_t v = (int64_t)cscs_key_of(seedh, nkeys, id);
        memcpy(out, &v, sizeof v);
    } else if (a->type == CSCS_I32) {
        uint32_t v = (uint32_t)mix(seedh, id, (unsigned)attr * 4);
        memcpy(out, &v, sizeof v);
    } else if (a->type == CSCS_I64) {
        uint64_t v = mix(seedh, id, (unsigned)attr * 4);
        memcpy(out, &v, sizeof v);
    } else {
        char *s = out;
        uint64_t h = 0;
        for (unsigned j = 0; j < a->width; j++) {
            if (j % 12 == 0)
                h = mix(seedh, id, (unsigned)attr * 4 + j / 12);
            s[j] = (char)('a' + ((h >> (5 * (j % 12))) & 31) % 26);
        }
    }
}
