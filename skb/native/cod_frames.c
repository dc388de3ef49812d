/* cod_frames: the direct channel's frames, read and written in C.
 *
 * A foreign library of the SKB engine (skb/prolog/cod_frames.pl loads it;
 * cod_direct.pl uses it when it is built).  Reading a request frame and
 * turning its JSON into a dict took the engine ~15 us of CPU in Prolog
 * (byte list, UTF-8 decoding, a regular expression, the term reader, the
 * term walk); here it is one read and one jansson parse.  Writing a reply
 * frame made a byte list of the whole reply to count its bytes; here the
 * UTF-8 text is written after its length in one call.
 *
 * The reader only ever narrows what is accepted: any text on which jansson
 * and library(http/json) might disagree is declined (raw(Text) is returned)
 * and the caller parses it with the library, as before: text that is not
 * valid UTF-8 or that jansson refuses (syntax, trailing text, duplicate
 * keys, NUL, integers beyond 64 bits, lone surrogates, nesting past
 * jansson's bound), and bodies over MAX_PARSED_BYTES.  One difference is kept on purpose: an escaped UTF-16
 * surrogate pair is one character, as JSON (RFC 8259) and the Resource
 * Manager's reader say; library(http/json) makes it two surrogate code
 * points, which the engine cannot use in an atom.
 *
 *   cod_read_frame(+In, +B0, +MaxBytes, -Frame)
 *      In is a binary stream whose first header byte B0 was read already.
 *      Frame is dict(Dict) for a JSON object read here, raw(Text) for a
 *      body declined here (Text: its bytes, one character each), too_big(Size)
 *      for a header over MaxBytes (the body is not read), or closed when the
 *      stream ends inside the frame.  Errors of In (timeouts) are raised.
 *
 *   cod_write_frame(+Out, +Text, +MaxBytes, -Size)
 *      Size is the length of Text in UTF-8; if it is at most MaxBytes the
 *      frame (4-byte big-endian length, then the bytes) is written to the
 *      binary stream Out and flushed.  Errors of Out are raised.
 */
#include <SWI-Stream.h>
#include <SWI-Prolog.h>
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static atom_t ATOM_true_, ATOM_false_, ATOM_null_;
static functor_t FUNCTOR_dict1, FUNCTOR_raw1, FUNCTOR_too_big1;

/* Nothing declined here is a request: this bounds only the C stack. */
#define MAX_NESTING 512
/* A body is parsed here only up to this size: jansson's tree (its memory is outside the
 * engine's Prolog stack limits) takes up to ~40 bytes per byte of text such as "[],[],...",
 * so ~2.6 MB per connection at most.  A request is a goal text and a few keys; a larger body goes
 * to the library, as with the Prolog reader (cod_fastjson.pl's max_chars). */
#define MAX_PARSED_BYTES 65536

static int put_json(term_t t, json_t *v, int depth);

static int put_array(term_t t, json_t *v, int depth) {
    term_t head = PL_new_term_ref();
    if (!head || !PL_put_nil(t))
        return FALSE;
    for (size_t i = json_array_size(v); i-- > 0;) {
        if (!put_json(head, json_array_get(v, i), depth + 1) || !PL_cons_list(t, head, t))
            return FALSE;
    }
    return TRUE;
}

static int put_object(term_t t, json_t *v, int depth) {
    size_t n = json_object_size(v);
    atom_t *keys = n ? calloc(n, sizeof *keys) : NULL;
    term_t values = PL_new_term_refs(n);
    int ok = (n == 0 || keys) && values;
    size_t made = 0;
    const char *key;
    json_t *value;
    json_object_foreach(v, key, value) {
        if (!ok)
            break;
        keys[made] = PL_new_atom_mbchars(REP_UTF8, strlen(key), key);
        ok = keys[made] && put_json(values + made, value, depth + 1);
        if (keys[made])
            made++;
    }
    ok = ok && made == n && PL_put_dict(t, 0, n, keys, values);
    for (size_t i = 0; i < made; i++)
        PL_unregister_atom(keys[i]);
    free(keys);
    return ok;
}

static int put_json(term_t t, json_t *v, int depth) {
    if (depth > MAX_NESTING)
        return FALSE;
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return put_object(t, v, depth);
    case JSON_ARRAY:
        return put_array(t, v, depth);
    case JSON_STRING:
        return PL_put_chars(t, PL_STRING | REP_UTF8, json_string_length(v), json_string_value(v));
    case JSON_INTEGER:
        return PL_put_int64(t, (int64_t)json_integer_value(v));
    case JSON_REAL:
        return PL_put_float(t, json_real_value(v));
    case JSON_TRUE:
        return PL_put_atom(t, ATOM_true_);
    case JSON_FALSE:
        return PL_put_atom(t, ATOM_false_);
    case JSON_NULL:
        return PL_put_atom(t, ATOM_null_);
    }
    return FALSE;
}

/* The dict of a JSON object in body[0..len), or FALSE when declined. */
static int put_request_dict(term_t dict, const char *body, size_t len) {
    if (len > MAX_PARSED_BYTES)
        return FALSE;
    json_error_t error;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &error);
    if (!root)
        return FALSE;
    fid_t fid = PL_open_foreign_frame();
    int ok = fid && json_is_object(root) && put_json(dict, root, 0);
    json_decref(root);
    if (fid) {
        if (ok)
            PL_close_foreign_frame(fid);
        else
            PL_discard_foreign_frame(fid);
    }
    return ok;
}

/* Read exactly n bytes; FALSE on end of stream or error (the stream's
 * error is raised by PL_release_stream). */
static int read_exactly(IOSTREAM *in, char *buf, size_t n) {
    return Sfread(buf, 1, n, in) == n;
}

static foreign_t cod_read_frame(term_t in_t, term_t b0_t, term_t max_t, term_t frame) {
    IOSTREAM *in;
    int b0;
    int64_t max;
    if (!PL_get_integer_ex(b0_t, &b0) || !PL_get_int64_ex(max_t, &max))
        return FALSE;
    if (!PL_get_stream(in_t, &in, SIO_INPUT))
        return FALSE;
    unsigned char hdr[3];
    char *body = NULL;
    int ok = FALSE, result = 0; /* 1 closed, 2 too big, 3 body read */
    uint32_t size = 0;
    if (!read_exactly(in, (char *)hdr, 3)) {
        result = 1;
    } else {
        size = ((uint32_t)(b0 & 0xff) << 24) | ((uint32_t)hdr[0] << 16) | ((uint32_t)hdr[1] << 8) | hdr[2];
        if ((int64_t)size > max) {
            result = 2;
        } else if (!(body = malloc(size ? size : 1))) {
            PL_release_stream(in);
            return PL_resource_error("memory");
        } else {
            result = read_exactly(in, body, size) ? 3 : 1;
        }
    }
    /* A timeout or an I/O error of In, or a signal's exception raised while the read waited
     * (a revocation: thread_signal/2 in cod_direct.pl): it passes on. */
    if (!PL_release_stream(in) || PL_exception(0)) {
        free(body);
        return FALSE;
    }
    if (result == 1) {
        ok = PL_unify_atom_chars(frame, "closed");
    } else if (result == 2) {
        ok = PL_unify_term(frame, PL_FUNCTOR, FUNCTOR_too_big1, PL_INT64, (int64_t)size);
    } else {
        term_t dict = PL_new_term_ref();
        if (dict && put_request_dict(dict, body, size))
            ok = PL_unify_term(frame, PL_FUNCTOR, FUNCTOR_dict1, PL_TERM, dict);
        else if (!PL_exception(0) && dict && PL_put_chars(dict, PL_STRING | REP_ISO_LATIN_1, size, body))
            ok = PL_unify_term(frame, PL_FUNCTOR, FUNCTOR_raw1, PL_TERM, dict);
    }
    free(body);
    return ok;
}

static foreign_t cod_write_frame(term_t out_t, term_t text_t, term_t max_t, term_t size_t_) {
    size_t len;
    char *text;
    int64_t max;
    if (!PL_get_int64_ex(max_t, &max) ||
        !PL_get_nchars(text_t, &len, &text, CVT_STRING | CVT_ATOM | REP_UTF8 | CVT_EXCEPTION | BUF_STACK))
        return FALSE;
    if (!PL_unify_int64(size_t_, (int64_t)len))
        return FALSE;
    if ((int64_t)len > max || len > UINT32_MAX)
        return TRUE;
    IOSTREAM *out;
    if (!PL_get_stream(out_t, &out, SIO_OUTPUT))
        return FALSE;
    unsigned char hdr[4] = {(unsigned char)(len >> 24), (unsigned char)(len >> 16), (unsigned char)(len >> 8),
                            (unsigned char)len};
    if (Sfwrite(hdr, 1, 4, out) == 4 && Sfwrite(text, 1, len, out) == len)
        Sflush(out);
    return PL_release_stream(out);
}

install_t install_cod_frames(void) {
    ATOM_true_ = PL_new_atom("true");
    ATOM_false_ = PL_new_atom("false");
    ATOM_null_ = PL_new_atom("null");
    FUNCTOR_dict1 = PL_new_functor(PL_new_atom("dict"), 1);
    FUNCTOR_raw1 = PL_new_functor(PL_new_atom("raw"), 1);
    FUNCTOR_too_big1 = PL_new_functor(PL_new_atom("too_big"), 1);
    PL_register_foreign("cod_read_frame", 4, cod_read_frame, 0);
    PL_register_foreign("cod_write_frame", 4, cod_write_frame, 0);
}
