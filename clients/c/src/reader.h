/* The protocol reader: bytes in, messages out, no I/O.
 *
 * The connection reads from its socket into the reader; the tests and the fuzz target feed
 * it bytes directly.  A frame is a 4-byte big-endian length and that many bytes of JSON.
 * Not installed and not exported from libcod.so: the tests and the fuzzer link libcod.a.
 */
#ifndef COD_READER_H
#define COD_READER_H

#include <jansson.h>
#include <stddef.h>

#include "cod.h"

typedef struct cod_reader {
    char *buf;
    size_t off, len, cap;  /* unread bytes are buf[off, len) */
    size_t max_frame;
} cod_reader;

enum cod_msg_kind {
    COD_MSG_REPLY = 1,   /* a response: result or error */
    COD_MSG_UPCALL = 2,  /* a notification from the daemon */
    COD_MSG_BAD = 3      /* a frame that is not a protocol message (why says what); the stream goes on */
};

typedef struct cod_msg {
    int kind;
    json_t *root;        /* owned, NULL for a frame that is not JSON */
    int has_id;          /* a reply whose id is an integer */
    long long id;
    json_t *result;      /* borrowed from root */
    json_t *error;       /* borrowed: {"code", "message", "data"} */
    const char *method;  /* upcall */
    json_t *params;      /* upcall, borrowed; an empty object if absent */
    char *why;           /* COD_MSG_BAD */
} cod_msg;

void cod_reader_init(cod_reader *r, size_t max_frame);
void cod_reader_release(cod_reader *r);
void cod_reader_reset(cod_reader *r);
int cod_reader_feed(cod_reader *r, const void *data, size_t n);  /* 0 or COD_ENOMEM */
/* Room for at least want bytes to read into; then cod_reader_wrote(r, n). NULL on ENOMEM. */
char *cod_reader_space(cod_reader *r, size_t want, size_t *got);
void cod_reader_wrote(cod_reader *r, size_t n);
size_t cod_reader_pending(const cod_reader *r);
/* 1: *m holds a message (release it); 0: more bytes needed; COD_EPROTO: a frame over the
 * limit (m->why says so; the stream cannot go on); COD_ENOMEM. */
int cod_reader_next(cod_reader *r, cod_msg *m);
void cod_msg_release(cod_msg *m);

/* JSON text to a value, the way the reader parses frames: strict UTF-8, NUL allowed in
 * strings, integers beyond 64 bits kept exactly as COD_BIGINT.  NULL with *why on error. */
json_t *cod_json_parse(const char *text, size_t len, char **why);

#endif
