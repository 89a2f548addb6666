/*
 * tokmap.c - the tokenizer compression of SPEC.md section 4: every raw id of
 * a byte-level BPE tokenizer.json gets the compressed id of its normalized
 * text, in first-seen order of keys.
 *
 * The JSON is parsed with jansson (whole file, bounded by
 * ENGRAM_TOKENIZER_MAX_BYTES); Unicode normalization, categories and case
 * come from utf8proc.  Keys are byte strings with explicit lengths (a key
 * may hold U+0000).
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <utf8proc.h>

#include "engram_tools.h"
#include "format/layout.h"
#include "sha256.h"
#include "common/util.h"

/* ------------------------------------------------------------ text */

/* Decodes one code point of valid UTF-8 (the caller checked validity). */
static size_t next_cp(const uint8_t *s, size_t n, int32_t *cp)
{
    utf8proc_ssize_t k = utf8proc_iterate(s, (utf8proc_ssize_t)n, cp);
    return k > 0 ? (size_t)k : 1;
}

/* Strict UTF-8 (no overlongs, surrogates or code points above U+10FFFF):
 * 1 if s is valid and holds no U+FFFD, 0 otherwise (a lossy decoder would
 * put a U+FFFD in the text). */
static int clean_utf8(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate(s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k <= 0 || cp == 0xFFFD)
            return 0;
        i += (size_t)k;
    }
    return 1;
}

static int is_white_space(int32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

static int is_collapsible(int32_t c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

int engram_text_normalize(const char *text, size_t len, char **out, size_t *out_len)
{
    if (!out || !out_len || (len > 0 && !text))
        return -EINVAL;
    if (len > (size_t)1 << 30)
        return -EINVAL;
    /* NFKC, then NFD.  utf8proc_map takes an explicit length, so U+0000
     * passes through like any other code point; it also validates the
     * input (strict UTF-8, as utf8proc_iterate) before writing anything. */
    uint8_t *nfkc = NULL, *nfd = NULL;
    utf8proc_ssize_t n1 = utf8proc_map((const uint8_t *)(len ? text : ""), (utf8proc_ssize_t)len, &nfkc,
                                       UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
    if (n1 < 0)
        return n1 == UTF8PROC_ERROR_NOMEM ? -ENOMEM : -EILSEQ;
    utf8proc_ssize_t n2 = utf8proc_map(nfkc, n1, &nfd, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE);
    free(nfkc);
    if (n2 < 0)
        return n2 == UTF8PROC_ERROR_NOMEM ? -ENOMEM : -EILSEQ;
    /* Drop Mn, lowercase per code point (full mapping: U+0130 becomes
     * "i" U+0307; no context rules), collapse runs of ASCII space, tab, CR
     * and LF into one space.  Each code point grows to at most 2 (U+0130)
     * of at most 4 bytes. */
    size_t cap = (size_t)n2 * 2 + 8, m = 0;
    uint8_t *buf = malloc(cap);
    if (!buf) {
        free(nfd);
        return -ENOMEM;
    }
    int in_run = 0;
    for (size_t i = 0; i < (size_t)n2;) {
        int32_t cp;
        i += next_cp(nfd + i, (size_t)n2 - i, &cp);
        if (utf8proc_category(cp) == UTF8PROC_CATEGORY_MN)
            continue;
        if (is_collapsible(cp)) {
            if (!in_run)
                buf[m++] = ' ';
            in_run = 1;
            continue;
        }
        in_run = 0;
        if (cp == 0x130) {
            m += (size_t)utf8proc_encode_char(0x69, buf + m);
            m += (size_t)utf8proc_encode_char(0x307, buf + m);
        } else {
            m += (size_t)utf8proc_encode_char(utf8proc_tolower(cp), buf + m);
        }
    }
    free(nfd);
    /* Exactly " " stays; otherwise strip White_Space at both ends. */
    size_t lo = 0, hi = m;
    if (!(m == 1 && buf[0] == ' ')) {
        while (lo < hi) {
            int32_t cp;
            size_t k = next_cp(buf + lo, hi - lo, &cp);
            if (!is_white_space(cp))
                break;
            lo += k;
        }
        while (hi > lo) {
            size_t start = hi - 1;
            while (start > lo && (buf[start] & 0xC0) == 0x80)
                start--;
            int32_t cp;
            next_cp(buf + start, hi - start, &cp);
            if (!is_white_space(cp))
                break;
            hi = start;
        }
    }
    memmove(buf, buf + lo, hi - lo);
    buf[hi - lo] = '\0';
    *out = (char *)buf;
    *out_len = hi - lo;
    return 0;
}

/* ------------------------------------------------------------ byte level */

/* GPT-2's byte-level alphabet: printable bytes stand for themselves, the
 * other 68 bytes for U+0100 onwards in byte order.  unbyte[c] = the byte
 * code point c stands for, or -1. */
static void byte_level_inverse(int16_t unbyte[0x144])
{
    for (int c = 0; c < 0x144; c++)
        unbyte[c] = -1;
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        if (printable)
            unbyte[b] = (int16_t)b;
        else
            unbyte[0x100 + n++] = (int16_t)b;
    }
}

/* The bytes a byte-level decoder makes of one token string: each character
 * back to its byte; a token with a character outside the alphabet passes
 * through as its own UTF-8.  out has room for len bytes. */
static size_t byte_level_decode(const int16_t *unbyte, const uint8_t *s, size_t len, uint8_t *out)
{
    size_t m = 0;
    for (size_t i = 0; i < len;) {
        int32_t cp;
        i += next_cp(s + i, len - i, &cp);
        if (cp < 0 || cp >= 0x144 || unbyte[cp] < 0) {
            memcpy(out, s, len);
            return len;
        }
        out[m++] = (uint8_t)unbyte[cp];
    }
    return m;
}

/* ------------------------------------------------------------ key table */

struct keytab {
    uint32_t *slot;     /* [cap] compressed id + 1, 0 = empty */
    size_t cap;
    char **key;         /* [n] */
    uint32_t *len, *group;
    uint32_t n;
};

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

/* The compressed id of key (taking ownership of it), or -ENOMEM. */
static int64_t keytab_id(struct keytab *t, char *key, size_t len)
{
    size_t i = (size_t)hash_bytes(key, len) & (t->cap - 1);
    while (t->slot[i]) {
        uint32_t id = t->slot[i] - 1;
        if (t->len[id] == len && memcmp(t->key[id], key, len) == 0) {
            free(key);
            t->group[id]++;
            return id;
        }
        i = (i + 1) & (t->cap - 1);
    }
    t->slot[i] = t->n + 1;
    t->key[t->n] = key;
    t->len[t->n] = (uint32_t)len;
    t->group[t->n] = 1;
    return t->n++;
}

/* ------------------------------------------------------------ tokenizer.json */

static int is_byte_level(json_t *dec)
{
    const char *type = json_string_value(json_object_get(dec, "type"));
    if (!type)
        return 0;
    if (!strcmp(type, "ByteLevel"))
        return 1;
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(dec, "decoders"), *d;
        size_t i;
        json_array_foreach(list, i, d)
            if (is_byte_level(d))
                return 1;
    }
    return 0;
}

void engram_tokmap_free(engram_tokmap *tm)
{
    if (!tm)
        return;
    if (tm->key)
        for (uint32_t i = 0; i < tm->compressed_vocab; i++)
            free(tm->key[i]);
    free(tm->key);
    free(tm->key_len);
    free(tm->group);
    free(tm->map);
    memset(tm, 0, sizeof *tm);
}

/* What jansson's loader pulls from: the descriptor, read(2) in pieces of
 * sizeof buf and handed out in the pieces jansson asks for (1 KiB in 2.14;
 * json_loadfd reads one byte a call: 7.8 M system calls, 3.4 s, for the
 * DeepSeek V3 tokenizer), never more than ENGRAM_TOKENIZER_MAX_BYTES in
 * all, so a file that grows after its fstat is still bounded. */
struct json_src {
    int fd;
    int err;      /* 0, or the errno that ended the read */
    int over;     /* the limit was passed */
    uint64_t got; /* bytes read */
    size_t pos, have;
    char buf[1 << 16];
};

static size_t json_src_read(void *dst, size_t len, void *data)
{
    struct json_src *s = data;
    while (s->pos == s->have) {
        ssize_t r = read(s->fd, s->buf, sizeof s->buf);
        if (r < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (r < 0) {
            s->err = errno;
            return (size_t)-1;
        }
        if (r == 0)
            return 0;
        if ((s->got += (uint64_t)r) > ENGRAM_TOKENIZER_MAX_BYTES) {
            s->over = 1;
            return (size_t)-1;
        }
        s->pos = 0;
        s->have = (size_t)r;
    }
    size_t n = s->have - s->pos < len ? s->have - s->pos : len;
    memcpy(dst, s->buf + s->pos, n);
    s->pos += n;
    return n;
}

/* The tokenizer.json at path, parsed; the size limit is checked on the
 * descriptor that is then parsed, and again while it is read.  0 or a
 * negative errno (err filled). */
static int load_json(const char *path, json_t **root, engram_error *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return err_set(err, -e, ENGRAM_NO_OFFSET, "cannot open '%s': %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET,
                       "'%s' is not a regular file (the size limit needs one)", path);
    }
    if ((uint64_t)st.st_size > ENGRAM_TOKENIZER_MAX_BYTES) {
        close(fd);
        return err_set(err, -EFBIG, ENGRAM_NO_OFFSET, "'%s' is %llu bytes; the limit is %u", path,
                       (unsigned long long)st.st_size, ENGRAM_TOKENIZER_MAX_BYTES);
    }
    json_error_t je;
    struct json_src *src = malloc(sizeof *src);
    if (!src) {
        close(fd);
        return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "%s: out of memory", path);
    }
    src->fd = fd;
    src->err = src->over = 0;
    src->got = 0;
    src->pos = src->have = 0;
    *root = json_load_callback(json_src_read, src, JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES, &je);
    int e = src->over ? EFBIG : src->err, over = src->over;
    free(src);
    close(fd);
    /* jansson takes a failed read for the end of the input: a document
     * complete before it would parse */
    if (e && *root) {
        json_decref(*root);
        *root = NULL;
    }
    if (over)
        return err_set(err, -EFBIG, ENGRAM_NO_OFFSET, "'%s' grew past the limit of %u bytes", path,
                       ENGRAM_TOKENIZER_MAX_BYTES);
    if (e)
        return err_set(err, -e, ENGRAM_NO_OFFSET, "cannot read '%s': %s", path, strerror(e));
    if (!*root)
        return err_set(err, -EBADMSG, je.position >= 0 ? (uint64_t)je.position : ENGRAM_NO_OFFSET,
                       "%s: line %d column %d: %s", path, je.line, je.column, je.text);
    return 0;
}

/* Checks that root is a byte-level BPE tokenizer whose ids are all in
 * range; *vocab: model.vocab, *added: added_tokens (or NULL), *n: the raw
 * vocabulary size (one past the largest id of either list).  0 or a
 * negative errno (err filled). */
static int check_tokenizer(const char *path, json_t *root, json_t **vocab, json_t **added, uint64_t *n,
                           engram_error *err)
{
    json_t *model = json_object_get(root, "model");
    *vocab = json_object_get(model, "vocab");
    *added = json_object_get(root, "added_tokens");
    const char *mtype = json_string_value(json_object_get(model, "type"));
    if (!json_is_object(model))
        return err_set(err, -EBADMSG, ENGRAM_NO_OFFSET, "%s: no model object", path);
    if (!mtype || strcmp(mtype, "BPE") != 0 || !is_byte_level(json_object_get(root, "decoder")))
        return err_set(err, -ENOTSUP, ENGRAM_NO_OFFSET,
                       "%s: not a byte-level BPE tokenizer (model.type %s, decoder without ByteLevel)",
                       path, mtype ? mtype : "missing");
    if (!json_is_object(*vocab))
        return err_set(err, -EBADMSG, ENGRAM_NO_OFFSET, "%s: no model.vocab object", path);
    if (*added && !json_is_array(*added))
        return err_set(err, -EBADMSG, ENGRAM_NO_OFFSET, "%s: added_tokens is not an array", path);
    *n = 0;
    const char *k;
    json_t *v;
    json_object_foreach(*vocab, k, v) {
        json_int_t id = json_integer_value(v);
        if (!json_is_integer(v) || id < 0 || id >= ENGRAM_MAX_VOCAB)
            return err_set(err, -EBADMSG, ENGRAM_NO_OFFSET,
                           "%s: model.vocab entry '%.40s' has a bad id (integers 0..%u)", path, k,
                           ENGRAM_MAX_VOCAB - 1);
        if ((uint64_t)id + 1 > *n)
            *n = (uint64_t)id + 1;
    }
    size_t ai;
    json_array_foreach(*added, ai, v) {
        json_t *idv = json_object_get(v, "id");
        json_int_t id = json_integer_value(idv);
        if (!json_is_integer(idv) || id < 0 || id >= ENGRAM_MAX_VOCAB ||
            !json_is_string(json_object_get(v, "content")))
            return err_set(err, -EBADMSG, ENGRAM_NO_OFFSET,
                           "%s: added_tokens[%zu] needs an integer id 0..%u and a string content", path,
                           ai, ENGRAM_MAX_VOCAB - 1);
        if ((uint64_t)id + 1 > *n)
            *n = (uint64_t)id + 1;
    }
    if (*n == 0)
        return err_set(err, -EBADMSG, ENGRAM_NO_OFFSET, "%s: empty vocabulary", path);
    return 0;
}

/* Every raw id's token string (pointing into the JSON; NULL: no token),
 * and which ids are added tokens. */
struct tokens {
    const char **tok;
    uint32_t *len;
    uint8_t *is_added;
    size_t longest;     /* bytes of the longest string */
};

static void tokens_free(struct tokens *tk)
{
    free(tk->tok);
    free(tk->len);
    free(tk->is_added);
}

/* The token strings of ids 0..n-1 from model.vocab, then added_tokens,
 * which take their id whatever the vocabulary says (they decode to their
 * content, special or not).  0 or a negative errno (err filled). */
static int collect_tokens(const char *path, json_t *vocab, json_t *added, uint64_t n, struct tokens *tk,
                          engram_error *err)
{
    tk->tok = calloc(n, sizeof *tk->tok);
    tk->len = calloc(n, sizeof *tk->len);
    if (!tk->tok || !tk->len)
        return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory");
    const char *k;
    size_t klen;
    json_t *v;
    json_object_keylen_foreach(vocab, k, klen, v) {
        json_int_t id = json_integer_value(v);
        if (tk->tok[id])
            return err_set(err, -EBADMSG, ENGRAM_NO_OFFSET,
                           "%s: model.vocab gives id %lld to two tokens ('%.40s' and '%.40s')", path,
                           (long long)id, tk->tok[id], k);
        if (klen > UINT32_MAX / 2)
            return err_set(err, -EBADMSG, ENGRAM_NO_OFFSET, "%s: token too long", path);
        tk->tok[id] = k;
        tk->len[id] = (uint32_t)klen;
        tk->longest = klen > tk->longest ? klen : tk->longest;
    }
    tk->is_added = calloc(n, 1);
    if (!tk->is_added)
        return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory");
    size_t ai;
    json_array_foreach(added, ai, v) {
        json_t *c = json_object_get(v, "content");
        json_int_t id = json_integer_value(json_object_get(v, "id"));
        if (json_string_length(c) > UINT32_MAX / 2)
            return err_set(err, -EBADMSG, ENGRAM_NO_OFFSET, "%s: added token too long", path);
        if (tk->is_added[id])
            return err_set(err, -EBADMSG, ENGRAM_NO_OFFSET,
                           "%s: added_tokens[%zu] reuses id %lld of an earlier added token", path, ai,
                           (long long)id);
        tk->tok[id] = json_string_value(c);
        tk->len[id] = (uint32_t)json_string_length(c);
        tk->is_added[id] = 1;
        tk->longest = tk->len[id] > tk->longest ? tk->len[id] : tk->longest;
    }
    return 0;
}

/* A copy of s[0..len) with a NUL after it, or NULL. */
static char *copy_key(const uint8_t *s, size_t len)
{
    char *key = malloc(len + 1);
    if (key) {
        memcpy(key, s, len);
        key[len] = '\0';
    }
    return key;
}

/* The key of one token (raw: its string, raw_len bytes): the normalized
 * text (added tokens: their content; BPE tokens: their bytes, decoded into
 * buf), the raw string where the text is not clean UTF-8 (*raw_key set),
 * or the decoded text itself where it normalizes to nothing.  The new key (the caller owns it), or NULL when
 * out of memory. */
static char *token_key(const int16_t *unbyte, const uint8_t *raw, size_t raw_len, int added, uint8_t *buf,
                       size_t *key_len, int *raw_key)
{
    size_t tlen = added ? raw_len : byte_level_decode(unbyte, raw, raw_len, buf);
    const uint8_t *text = added ? raw : buf;
    *raw_key = !clean_utf8(text, tlen);
    if (*raw_key) {
        *key_len = raw_len;
        return copy_key(raw, raw_len);
    }
    char *key = NULL;
    int nrc = engram_text_normalize((const char *)text, tlen, &key, key_len);
    if (nrc < 0)
        return NULL;
    if (*key_len == 0) {
        free(key);
        *key_len = tlen;
        return copy_key(text, tlen);
    }
    return key;
}

/* tm's map (raw id -> compressed id, in first-seen order of keys), keys
 * and groups, from the n ids' strings.  0 or a negative errno (err
 * filled); tm's map is allocated either way (engram_tokmap_free). */
static int build_map(const struct tokens *tk, uint64_t n, engram_tokmap *tm, engram_error *err)
{
    int rc = 0;
    struct keytab kt = {0};
    kt.cap = 1;
    while (kt.cap < 2 * n)
        kt.cap <<= 1;
    kt.slot = calloc(kt.cap, sizeof *kt.slot);
    kt.key = calloc(n, sizeof *kt.key);
    kt.len = calloc(n, sizeof *kt.len);
    kt.group = calloc(n, sizeof *kt.group);
    tm->map = malloc(n * sizeof *tm->map);
    uint8_t *buf = malloc(tk->longest + 1);
    if (!kt.slot || !kt.key || !kt.len || !kt.group || !tm->map || !buf) {
        rc = err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory");
        goto out;
    }
    int16_t unbyte[0x144];
    byte_level_inverse(unbyte);
    for (uint64_t id = 0; id < n; id++) {
        const uint8_t *raw = (const uint8_t *)(tk->tok[id] ? tk->tok[id] : "");
        size_t raw_len = tk->tok[id] ? tk->len[id] : 0, key_len = 0;
        int raw_key;
        if (!tk->tok[id])
            tm->missing++;
        char *key = token_key(unbyte, raw, raw_len, tk->is_added[id], buf, &key_len, &raw_key);
        tm->raw_keys += (uint32_t)raw_key;
        if (!key) {
            rc = err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory");
            goto out;
        }
        tm->map[id] = (uint32_t)keytab_id(&kt, key, key_len);
    }
    tm->vocab = (uint32_t)n;
    tm->compressed_vocab = kt.n;
    tm->key = kt.key;
    tm->key_len = kt.len;
    tm->group = kt.group;
    kt.key = NULL;
    kt.len = kt.group = NULL;
out:
    if (kt.key)
        for (uint32_t i = 0; i < kt.n; i++)
            free(kt.key[i]);
    free(kt.key);
    free(kt.len);
    free(kt.group);
    free(kt.slot);
    free(buf);
    return rc;
}

/* SHA-256 of the map as little-endian u32. */
static void map_sha256(engram_tokmap *tm)
{
    struct sha256 h;
    sha256_init(&h);
    for (uint32_t i = 0; i < tm->vocab; i++) {
        uint8_t le[4] = {(uint8_t)tm->map[i], (uint8_t)(tm->map[i] >> 8), (uint8_t)(tm->map[i] >> 16),
                         (uint8_t)(tm->map[i] >> 24)};
        sha256_update(&h, le, 4);
    }
    sha256_final(&h, tm->sha256);
}

int engram_tokmap_from_json(const char *path, engram_tokmap *out, engram_error *err)
{
    if (!path || !out)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL argument");
    json_t *root = NULL, *vocab, *added;
    int rc = load_json(path, &root, err);
    if (rc)
        return rc;
    struct tokens tk = {0};
    engram_tokmap tm = {0};
    uint64_t n = 0;
    rc = check_tokenizer(path, root, &vocab, &added, &n, err);
    if (rc == 0)
        rc = collect_tokens(path, vocab, added, n, &tk, err);
    if (rc == 0)
        rc = build_map(&tk, n, &tm, err);
    if (rc == 0) {
        map_sha256(&tm);
        *out = tm;
        memset(&tm, 0, sizeof tm);
    }
    tokens_free(&tk);
    engram_tokmap_free(&tm);
    json_decref(root);
    return rc;
}
