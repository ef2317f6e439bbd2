/* spaCy's tokenizer loop for one ASCII whitespace-free chunk, compiled.
 *
 * Why: the Python loop of filters/words.py (prefix, suffix, special cases, URL, infix)
 * costs ~7 us per chunk it has not seen, and code holds ~200 distinct such chunks per
 * file (identifiers with their punctuation): half of the heuristic chain's time on code.
 * Here the same steps run over the chunk's bytes in C, ~20x faster.
 *
 * What it knows: the structure of spaCy's base prefix and suffix rules and English infix
 * rules restricted to ASCII (single-character affixes, runs of dots, `+` not before a
 * digit, currency and units after a digit, a final `.` after given characters or two
 * capitals, `'s`, the infix hyphens, commas, dots and operators between given classes).
 * What it is told: every character set and list (read off the regexes by probing them
 * in filters/spacy_rules.py), the special cases (a dict and the set of their beginnings), and
 * the URL regex's `match` (called only where a URL can match: see url_possible).
 * filters/words.py uses it only for the rules it checked it
 * against, and for any chunk with a non-ASCII character falls back to the Python loop;
 * tests/filters/test_words.py compares both with spaCy.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define NATIVE_VERSION 4  /* raise with every change of behaviour or interface */
#include <string.h>

typedef struct {
    PyObject_HEAD
    unsigned char pre1[128];    /* one-character prefixes (not '+' or '.') */
    unsigned char suf1[128];    /* one-character suffixes */
    unsigned char dot_after[128];  /* a final '.' after these is a suffix */
    unsigned char inf_q[128];   /* quote characters of the infix dot rule */
    unsigned char url_host[128];  /* characters of a URL host or IP (letters, digits, _ . -) */
    unsigned char url_need[128];  /* characters every URL match consumes */
    int n_need;
    Py_ssize_t max_special;      /* the longest special case */
    PyObject *after_digit;      /* tuple of bytes: suffixes after a digit (+, currency, units) */
    PyObject *special;          /* dict str -> tuple of str */
    PyObject *special_prefixes; /* frozenset of str */
    PyObject *url_match;        /* callable(str) -> match or None */
} Splitter;

#define IS_DIGIT(c) ((c) >= '0' && (c) <= '9')
#define IS_LOWER(c) ((c) >= 'a' && (c) <= 'z')
#define IS_UPPER(c) ((c) >= 'A' && (c) <= 'Z')
#define IS_ALPHA(c) (IS_LOWER(c) || IS_UPPER(c))

/* Sets table[c] for the characters of `chars`; returns how many distinct, or -1. */
static int fill(unsigned char *table, PyObject *chars) {
    int n = 0;
    memset(table, 0, 128);
    if (!PyUnicode_Check(chars) || !PyUnicode_IS_ASCII(chars)) {
        PyErr_SetString(PyExc_TypeError, "character sets must be ASCII str");
        return -1;
    }
    const unsigned char *p = PyUnicode_1BYTE_DATA(chars);
    for (Py_ssize_t i = 0; i < PyUnicode_GET_LENGTH(chars); i++)
        if (!table[p[i]]) { table[p[i]] = 1; n++; }
    return n;
}

static int Splitter_init(Splitter *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"pre1", "suf1", "dot_after", "inf_q", "url_host", "url_need", "after_digit",
                            "special", "special_prefixes", "url_match", NULL};
    PyObject *pre1, *suf1, *dot_after, *inf_q, *url_host, *url_need, *after_digit, *special, *sp, *url;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOOO!O!O!O", names, &pre1, &suf1, &dot_after, &inf_q,
                                     &url_host, &url_need, &PyTuple_Type, &after_digit, &PyDict_Type, &special,
                                     &PyFrozenSet_Type, &sp, &url))
        return -1;
    if (fill(self->pre1, pre1) < 0 || fill(self->suf1, suf1) < 0 || fill(self->dot_after, dot_after) < 0 ||
        fill(self->inf_q, inf_q) < 0 || fill(self->url_host, url_host) < 0 || (self->n_need = fill(self->url_need, url_need)) < 0)
        return -1;
    /* every special case is a tuple of str; none longer than max_special can match */
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    self->max_special = 0;
    while (PyDict_Next(special, &pos, &key, &value)) {
        if (!PyUnicode_Check(key) || !PyTuple_Check(value)) {
            PyErr_SetString(PyExc_TypeError, "special must map str to tuples of str");
            return -1;
        }
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(value); i++)
            if (!PyUnicode_Check(PyTuple_GET_ITEM(value, i))) {
                PyErr_SetString(PyExc_TypeError, "special must map str to tuples of str");
                return -1;
            }
        if (PyUnicode_GET_LENGTH(key) > self->max_special) self->max_special = PyUnicode_GET_LENGTH(key);
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(after_digit); i++)
        if (!PyBytes_Check(PyTuple_GET_ITEM(after_digit, i)) || PyBytes_GET_SIZE(PyTuple_GET_ITEM(after_digit, i)) == 0) {
            PyErr_SetString(PyExc_TypeError, "after_digit must hold non-empty bytes");
            return -1;
        }
    Py_XSETREF(self->after_digit, Py_NewRef(after_digit));
    Py_XSETREF(self->special, Py_NewRef(special));
    Py_XSETREF(self->special_prefixes, Py_NewRef(sp));
    Py_XSETREF(self->url_match, Py_NewRef(url));
    return 0;
}

static void Splitter_dealloc(Splitter *self) {
    Py_XDECREF(self->after_digit);
    Py_XDECREF(self->special);
    Py_XDECREF(self->special_prefixes);
    Py_XDECREF(self->url_match);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The special case for s[a:b], borrowed, or NULL (with an error set on failure). */
static PyObject *special_get(Splitter *self, const unsigned char *s, Py_ssize_t a, Py_ssize_t b, int *err) {
    if (b - a > self->max_special) return NULL;  /* (also keeps long runs of affixes linear) */
    PyObject *key = PyUnicode_FromStringAndSize((const char *)s + a, b - a);
    if (key == NULL) { *err = 1; return NULL; }
    PyObject *v = PyDict_GetItemWithError(self->special, key);
    Py_DECREF(key);
    if (v == NULL && PyErr_Occurred()) *err = 1;
    return v;
}

static int push(PyObject *list, const unsigned char *s, Py_ssize_t a, Py_ssize_t b) {
    PyObject *t = PyUnicode_FromStringAndSize((const char *)s + a, b - a);
    if (t == NULL) return -1;
    int r = PyList_Append(list, t);
    Py_DECREF(t);
    return r;
}

static int extend(PyObject *list, PyObject *tup) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(tup); i++)
        if (PyList_Append(list, PyTuple_GET_ITEM(tup, i))) return -1;
    return 0;
}

/* Length of the prefix of s[a:b] (0: none). */
static Py_ssize_t prefix_len(Splitter *self, const unsigned char *s, Py_ssize_t a, Py_ssize_t b) {
    if (a >= b) return 0;
    unsigned char c = s[a];
    if (c == '.') {
        if (a + 1 < b && s[a + 1] == '.') {
            Py_ssize_t e = a + 2;
            while (e < b && s[e] == '.') e++;
            return e - a;
        }
        return 0;
    }
    if (c == '+') return (a + 1 < b && IS_DIGIT(s[a + 1])) ? 0 : 1;
    if (c == 'U' && b - a >= 3 && s[a + 1] == 'S' && s[a + 2] == '$') return 3;
    if ((c == 'C' || c == 'A') && b - a >= 2 && s[a + 1] == '$') return 2;
    return self->pre1[c] ? 1 : 0;
}

/* Where the suffix of s[a:b] starts (the leftmost match, as a search finds it), or -1. */
static Py_ssize_t suffix_start(Splitter *self, const unsigned char *s, Py_ssize_t a, Py_ssize_t b) {
    if (a >= b) return -1;
    Py_ssize_t best = -1;
    unsigned char last = s[b - 1];
#define TAKE(p) do { Py_ssize_t _p = (p); if (best < 0 || _p < best) best = _p; } while (0)
    if (self->suf1[last]) TAKE(b - 1);
    if (last == '.') {
        if (b - 2 >= a && s[b - 2] == '.') {
            Py_ssize_t p = b - 2;
            while (p - 1 >= a && s[p - 1] == '.') p--;
            TAKE(p);
        }
        if (b - 2 >= a && self->dot_after[s[b - 2]]) TAKE(b - 1);
        if (b - 3 >= a && IS_UPPER(s[b - 2]) && IS_UPPER(s[b - 3])) TAKE(b - 1);
    }
    if (b - a >= 2 && s[b - 2] == '\'' && (last == 's' || last == 'S')) TAKE(b - 2);
    PyObject *ad = self->after_digit;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(ad); i++) {
        PyObject *u = PyTuple_GET_ITEM(ad, i);
        Py_ssize_t m = PyBytes_GET_SIZE(u);
        if (b - a > m && IS_DIGIT(s[b - m - 1]) && memcmp(s + b - m, PyBytes_AS_STRING(u), m) == 0) TAKE(b - m);
    }
#undef TAKE
    return best;
}

/* The end of the infix match at p within s[a:b], or -1 (alternatives in spaCy's order). */
static Py_ssize_t infix_at(Splitter *self, const unsigned char *s, Py_ssize_t a, Py_ssize_t b, Py_ssize_t p) {
    unsigned char c = s[p];
    int before = p - 1 >= a ? s[p - 1] : -1;
    int next = p + 1 < b ? s[p + 1] : -1;
    if (c == '.' && next == '.') {
        Py_ssize_t e = p + 2;
        while (e < b && s[e] == '.') e++;
        return e;
    }
    if ((c == '+' || c == '-' || c == '*' || c == '^') && before >= 0 && IS_DIGIT(before) && next >= 0 &&
        (IS_DIGIT(next) || next == '-'))
        return p + 1;
    if (c == '.' && before >= 0 && (IS_LOWER(before) || self->inf_q[before]) && next >= 0 &&
        (IS_UPPER(next) || self->inf_q[next]))
        return p + 1;
    if (c == ',' && before >= 0 && IS_ALPHA(before) && next >= 0 && IS_ALPHA(next)) return p + 1;
    if (before >= 0 && (IS_ALPHA(before) || IS_DIGIT(before))) {
        if (c == '-') {
            for (Py_ssize_t k = 1; k <= 3; k++) {  /* "-", "--", "---" followed by a letter */
                if (p + k - 1 >= b || s[p + k - 1] != '-') break;
                if (p + k < b && IS_ALPHA(s[p + k])) return p + k;
            }
        } else if (c == '~') {
            if (next >= 0 && IS_ALPHA(next)) return p + 1;
        }
        if ((c == ':' || c == '<' || c == '>' || c == '=' || c == '/') && next >= 0 && IS_ALPHA(next)) return p + 1;
    }
    return -1;
}

/* A necessary condition for spaCy's URL regex to match s[a:b] (ASCII): every match
 * consumes the `need` characters; and without "@" or "://" the match is a host or IP
 * (letters, digits, "_", "-", ".") from the start followed by the end, ":", "/", "?" or
 * "#", since the host characters cannot end the host anywhere else. */
static int url_possible(Splitter *self, const unsigned char *s, Py_ssize_t a, Py_ssize_t b) {
    int seen[128] = {0}, n = 0;
    for (Py_ssize_t i = a; i < b; i++)
        if (self->url_need[s[i]] && !seen[s[i]]) { seen[s[i]] = 1; n++; }
    if (n < self->n_need) return 0;
    for (Py_ssize_t i = a; i < b; i++) {
        if (s[i] == '@') return 1;
        if (s[i] == ':' && i + 2 < b && s[i + 1] == '/' && s[i + 2] == '/') return 1;
    }
    Py_ssize_t e = a;
    while (e < b && self->url_host[s[e]]) e++;
    if (e == b) return 1;
    return s[e] == ':' || s[e] == '/' || s[e] == '?' || s[e] == '#';
}

static int infix_split(Splitter *self, PyObject *tokens, const unsigned char *s, Py_ssize_t a, Py_ssize_t b) {
    Py_ssize_t offset = a, p = a;
    while (p < b) {
        Py_ssize_t e = infix_at(self, s, a, b, p);
        if (e < 0) { p++; continue; }
        if (!(offset == a && p == a)) {
            if (offset < p && push(tokens, s, offset, p)) return -1;
            if (push(tokens, s, p, e)) return -1;
            offset = e;
        }
        p = e;
    }
    if (offset < b && push(tokens, s, offset, b)) return -1;
    return 0;
}

/* spaCy's second pass: contiguous tokens that together spell a special case become
 * that case, the longest (up to 4 tokens) first; as WordSplitter._merge_specials. A join
 * that is not the beginning of any special case cannot grow into one, so the joins stop
 * there. Returns a new list, or NULL. */
static PyObject *merge_specials(Splitter *self, PyObject *tokens) {
    Py_ssize_t n = PyList_GET_SIZE(tokens), i = 0;
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    while (i < n) {
        PyObject *first = PyList_GET_ITEM(tokens, i);
        int r = PySet_Contains(self->special_prefixes, first);
        if (r < 0) goto fail;
        PyObject *best = NULL;
        Py_ssize_t best_j = 0;
        if (r) {
            PyObject *joined = Py_NewRef(first);
            for (Py_ssize_t j = i + 1; j < n && j < i + 4; j++) {
                PyObject *longer = PyUnicode_Concat(joined, PyList_GET_ITEM(tokens, j));
                Py_DECREF(joined);
                if (longer == NULL) { Py_XDECREF(best); goto fail; }
                joined = longer;
                int more = PySet_Contains(self->special_prefixes, joined);
                if (more < 0) { Py_DECREF(joined); Py_XDECREF(best); goto fail; }
                if (!more) break;
                PyObject *v = PyDict_GetItemWithError(self->special, joined);
                if (v == NULL && PyErr_Occurred()) { Py_DECREF(joined); Py_XDECREF(best); goto fail; }
                if (v != NULL) { Py_XSETREF(best, Py_NewRef(v)); best_j = j + 1; }
            }
            Py_DECREF(joined);
        }
        if (best != NULL) {
            int e = extend(out, best);
            Py_DECREF(best);
            if (e) goto fail;
            i = best_j;
        } else {
            if (PyList_Append(out, first)) goto fail;
            i++;
        }
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

/* The words of one ASCII chunk, as filters/words.py's WordSplitter.split_chunk. */
static PyObject *split_ascii(Splitter *self, PyObject *chunk) {
    const unsigned char *s = PyUnicode_1BYTE_DATA(chunk);
    Py_ssize_t a = 0, b = PyUnicode_GET_LENGTH(chunk);
    int err = 0;
    PyObject *sp, *tokens = PyList_New(0), *suffixes = PyList_New(0), *out = NULL;
    if (tokens == NULL || suffixes == NULL) goto done;
    if (a < b) {
        if ((sp = special_get(self, s, a, b, &err)) != NULL) {
            if (extend(tokens, sp)) goto done;
            goto finish;
        }
        if (err) goto done;
        Py_ssize_t pm = prefix_len(self, s, a, b);
        Py_ssize_t ss = pm ? -1 : suffix_start(self, s, a, b);
        while (pm || ss >= 0) {
            if ((sp = special_get(self, s, a, b, &err)) != NULL) {
                if (extend(tokens, sp)) goto done;
                a = b;
                break;
            }
            if (err) goto done;
            if (pm) {
                if (push(tokens, s, a, a + pm)) goto done;
                a += pm;
                if ((sp = special_get(self, s, a, b, &err)) != NULL) {
                    pm = prefix_len(self, s, a, b);
                    ss = pm ? -1 : suffix_start(self, s, a, b);
                    continue;
                }
                if (err) goto done;
                ss = suffix_start(self, s, a, b);
            }
            if (ss >= 0) {
                if (ss == b) break;
                if (push(suffixes, s, ss, b)) goto done;
                b = ss;
            }
            pm = prefix_len(self, s, a, b);
            ss = pm ? -1 : suffix_start(self, s, a, b);
        }
        if (a < b) {
            int is_url = 0;
            if (url_possible(self, s, a, b)) {
                PyObject *sub = PyUnicode_FromStringAndSize((const char *)s + a, b - a);
                if (sub == NULL) goto done;
                PyObject *m = PyObject_CallOneArg(self->url_match, sub);
                Py_DECREF(sub);
                if (m == NULL) goto done;
                is_url = m != Py_None;
                Py_DECREF(m);
            }
            if (is_url) {
                if (push(tokens, s, a, b)) goto done;
            } else if ((sp = special_get(self, s, a, b, &err)) != NULL) {
                if (extend(tokens, sp)) goto done;
            } else if (err) {
                goto done;
            } else if (infix_split(self, tokens, s, a, b)) {
                goto done;
            }
        }
    }
finish:
    for (Py_ssize_t i = PyList_GET_SIZE(suffixes) - 1; i >= 0; i--)
        if (PyList_Append(tokens, PyList_GET_ITEM(suffixes, i))) goto done;
    if (PyList_GET_SIZE(tokens) > 1) {
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(tokens); i++) {
            int r = PySet_Contains(self->special_prefixes, PyList_GET_ITEM(tokens, i));
            if (r < 0) goto done;
            if (r) {
                PyObject *merged = merge_specials(self, tokens);
                if (merged == NULL) goto done;
                out = PySequence_Tuple(merged);
                Py_DECREF(merged);
                goto done;
            }
        }
    }
    out = PyList_AsTuple(tokens);
done:
    Py_XDECREF(tokens);
    Py_XDECREF(suffixes);
    return out;
}

static PyObject *Splitter_split(Splitter *self, PyObject *chunk) {
    if (!PyUnicode_Check(chunk)) {
        PyErr_SetString(PyExc_TypeError, "split() takes a str");
        return NULL;
    }
    if (self->special == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Splitter was not initialised");
        return NULL;
    }
    if (!PyUnicode_IS_ASCII(chunk)) Py_RETURN_NONE;
    return split_ascii(self, chunk);
}

/* ------------------------------------------------------------------ n-gram repetition
 *
 * Gopher's n-gram rules over a batch's word ids, document by document, in datatrove's
 * order with its early exit: for each rule (n, max fraction, kind), kind 0 is
 * `find_top_duplicate` over " ".join of the n-grams (the most frequent one's characters
 * times its count, ties to the first seen, skipped for a document under n words) and
 * kind 1 `find_all_duplicate` over "".join (the left-to-right scan that skips past a
 * repeat). An n-gram is identified by the 64-bit polynomial hash of its characters,
 * rolled from the words' hashes (h = h * B^len(w) + hash(w), the separator appended to
 * every word for " ".join), as filters/kernels.py defines them; one open-addressing table,
 * reused across documents by a generation stamp, counts them. */

#define SEP_BASE 0x9E3779B97F4A7C15ULL
#define BASE_ODD (SEP_BASE | 1ULL)

typedef struct {
    uint64_t *key;
    int32_t *count, *first;
    uint32_t *stamp;
    size_t mask;
    uint32_t gen;
} Table;

static int table_reserve(Table *t, Py_ssize_t n_items) {
    size_t want = 16;
    while (want < (size_t)n_items * 2) want <<= 1;
    if (t->mask + 1 >= want && t->key != NULL) return 0;
    PyMem_Free(t->key); PyMem_Free(t->count); PyMem_Free(t->first); PyMem_Free(t->stamp);
    t->key = PyMem_Malloc(want * sizeof(uint64_t));
    t->count = PyMem_Malloc(want * sizeof(int32_t));
    t->first = PyMem_Malloc(want * sizeof(int32_t));
    t->stamp = PyMem_Calloc(want, sizeof(uint32_t));
    t->mask = want - 1;
    t->gen = 0;
    if (!t->key || !t->count || !t->first || !t->stamp) { PyErr_NoMemory(); return -1; }
    return 0;
}

static void table_free(Table *t) {
    PyMem_Free(t->key); PyMem_Free(t->count); PyMem_Free(t->first); PyMem_Free(t->stamp);
}

static void table_clear(Table *t) {
    if (++t->gen == 0) {  /* stamps wrapped: really clear */
        memset(t->stamp, 0, (t->mask + 1) * sizeof(uint32_t));
        t->gen = 1;
    }
}

/* The slot of `key`, inserted (count 0, first = pos) when absent. */
static size_t table_slot(Table *t, uint64_t key, int32_t pos) {
    size_t i = (size_t)((key * 0x9E3779B97F4A7C15ULL) >> 20) & t->mask;
    while (t->stamp[i] == t->gen) {
        if (t->key[i] == key) return i;
        i = (i + 1) & t->mask;
    }
    t->stamp[i] = t->gen;
    t->key[i] = key;
    t->count[i] = 0;
    t->first[i] = pos;
    return i;
}

static inline uint64_t ngram_key(const int32_t *ids, Py_ssize_t i, int n, const uint64_t *hash, const uint64_t *pw,
                                 int sep, int64_t *chars, const int64_t *len) {
    uint64_t h = 0;
    int64_t c = 0;
    for (int k = 0; k < n; k++) {
        int32_t w = ids[i + k];
        h = h * pw[w] + hash[w];
        c += len[w];
        if (sep) { h = h * BASE_ODD + 32; c += 1; }
    }
    *chars = sep ? c - 1 : c;
    return h;
}

static int get_buffer(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, int writable, const char *name) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0) return -1;
    if (view->itemsize != itemsize || view->len % itemsize) {
        PyErr_Format(PyExc_TypeError, "%s: expected items of %zd bytes", name, itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* Characters of one document's rule: the top n-gram's (kind 0; -1 for a document under n
 * words, which datatrove skips) or the duplicated n-grams' (kind 1). */
static int64_t doc_chars(Table *t, const int32_t *w, Py_ssize_t nw, int n, int kind, const uint64_t *hash,
                         const uint64_t *pw, const int64_t *len) {
    int64_t chars = 0, gl;
    if (nw < n) return kind == 0 ? -1 : 0;
    table_clear(t);
    if (kind == 0) {
        int32_t best_count = 0, best_first = 0;
        int64_t best_len = 0;
        for (Py_ssize_t i = 0; i + n <= nw; i++) {
            uint64_t k = ngram_key(w, i, n, hash, pw, 1, &gl, len);
            size_t s = table_slot(t, k, (int32_t)i);
            int32_t c = ++t->count[s];
            if (c > best_count || (c == best_count && t->first[s] < best_first)) {
                best_count = c;
                best_first = t->first[s];
                best_len = gl;  /* the same n-gram as its first occurrence */
            }
        }
        return best_len * best_count;
    }
    Py_ssize_t i = 0;
    while (i + n <= nw) {
        uint64_t k = ngram_key(w, i, n, hash, pw, 0, &gl, len);
        size_t s = table_slot(t, k, (int32_t)i);
        if (t->count[s]) {
            chars += gl;
            i += n;
        } else {
            t->count[s] = 1;
            i += 1;
        }
    }
    return chars;
}

/* The buffers both entry points take: ids, off, hash, pow, length, then `extra` more. */
typedef struct {
    Py_buffer b[8];
    int got;
    Py_ssize_t n_docs, widest;
} Arrays;

static void arrays_release(Arrays *a) {
    for (int i = 0; i < a->got; i++) PyBuffer_Release(&a->b[i]);
    a->got = 0;
}

static int arrays_get(Arrays *a, PyObject **o, int count, const char **names, const Py_ssize_t *sizes, int writable_last) {
    a->got = 0;
    for (; a->got < count; a->got++)
        if (get_buffer(o[a->got], &a->b[a->got], sizes[a->got], writable_last && a->got == count - 1, names[a->got]) < 0) {
            arrays_release(a);
            return -1;
        }
    const int32_t *ids = a->b[0].buf;
    const int64_t *off = a->b[1].buf;
    Py_ssize_t n_ids = a->b[0].len / 4, n_vocab = a->b[2].len / 8;
    a->n_docs = a->b[1].len / 8 - 1;
    a->widest = 0;
    if (a->n_docs < 0 || a->b[3].len / 8 != n_vocab || a->b[4].len / 8 != n_vocab) goto bad;
    for (int i = 5; i < count; i++)
        if (a->b[i].len / a->b[i].itemsize < a->n_docs) goto bad;
    for (Py_ssize_t d = 0; d < a->n_docs; d++) {
        if (off[d] < 0 || off[d + 1] < off[d] || off[d + 1] > n_ids) goto bad;
        if (off[d + 1] - off[d] > a->widest) a->widest = off[d + 1] - off[d];
    }
    for (Py_ssize_t i = 0; i < n_ids; i++)
        if (ids[i] < 0 || ids[i] >= n_vocab) goto bad;
    return 0;
bad:
    PyErr_SetString(PyExc_ValueError, "arrays disagree: offsets, word ids or per-document lengths");
    arrays_release(a);
    return -1;
}

static PyObject *repetition(PyObject *mod, PyObject *args) {
    PyObject *o[7], *rules;
    if (!PyArg_ParseTuple(args, "OOOOOOOO!:repetition", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6],
                          &PyTuple_Type, &rules))
        return NULL;
    static const char *names[] = {"ids", "off", "hash", "pow", "length", "size", "out"};
    static const Py_ssize_t sizes[] = {4, 8, 8, 8, 8, 8, 4};
    int n_rules = (int)PyTuple_GET_SIZE(rules), rn[64], kind[64];
    double frac[64];
    if (n_rules > 64) { PyErr_SetString(PyExc_ValueError, "at most 64 rules"); return NULL; }
    for (int r = 0; r < n_rules; r++) {
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(rules, r), "idi", &rn[r], &frac[r], &kind[r])) return NULL;
        if (rn[r] < 1 || (kind[r] != 0 && kind[r] != 1)) { PyErr_SetString(PyExc_ValueError, "rules: n >= 1, kind 0 or 1"); return NULL; }
    }
    Arrays a;
    if (arrays_get(&a, o, 7, names, sizes, 1) < 0) return NULL;
    Table t = {0};
    PyObject *result = NULL;
    if (table_reserve(&t, a.widest) == 0) {
        const int32_t *ids = a.b[0].buf;
        const int64_t *off = a.b[1].buf, *len = a.b[4].buf, *size = a.b[5].buf;
        const uint64_t *hash = a.b[2].buf, *pw = a.b[3].buf;
        int32_t *out = a.b[6].buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t d = 0; d < a.n_docs; d++) {
            out[d] = -1;
            for (int r = 0; r < n_rules; r++) {
                int64_t chars = doc_chars(&t, ids + off[d], off[d + 1] - off[d], rn[r], kind[r], hash, pw, len);
                if (chars >= 0 && (double)chars / (double)size[d] > frac[r]) { out[d] = r; break; }
            }
        }
        Py_END_ALLOW_THREADS
        result = Py_NewRef(Py_None);
    }
    arrays_release(&a);
    table_free(&t);
    return result;
}

static PyObject *ngram_chars(PyObject *mod, PyObject *args) {
    PyObject *o[6];
    int n, kind;
    if (!PyArg_ParseTuple(args, "OOOOOiiO:ngram_chars", &o[0], &o[1], &o[2], &o[3], &o[4], &n, &kind, &o[5])) return NULL;
    if (n < 1 || (kind != 0 && kind != 1)) { PyErr_SetString(PyExc_ValueError, "n >= 1, kind 0 or 1"); return NULL; }
    static const char *names[] = {"ids", "off", "hash", "pow", "length", "out"};
    static const Py_ssize_t sizes[] = {4, 8, 8, 8, 8, 8};
    Arrays a;
    if (arrays_get(&a, o, 6, names, sizes, 1) < 0) return NULL;
    Table t = {0};
    PyObject *result = NULL;
    if (table_reserve(&t, a.widest) == 0) {
        const int32_t *ids = a.b[0].buf;
        const int64_t *off = a.b[1].buf, *len = a.b[4].buf;
        int64_t *out = a.b[5].buf;
        for (Py_ssize_t d = 0; d < a.n_docs; d++) {
            int64_t c = doc_chars(&t, ids + off[d], off[d + 1] - off[d], n, kind, a.b[2].buf, a.b[3].buf, len);
            out[d] = c < 0 ? 0 : c;
        }
        result = Py_NewRef(Py_None);
    }
    arrays_release(&a);
    table_free(&t);
    return result;
}

/* ------------------------------------------------------------------ a batch's word ids
 *
 * filters/kernels.py's Vocab.ids loop: every whitespace chunk of every text (str.split())
 * looked up in `chunks` (chunk -> tuple of word ids); a chunk not there gets its words from
 * `chunk_words(chunk)` (filters/words.py: its own cache and the splitter), each word its
 * id from `index` (word -> id, new words appended to `words`), and is remembered. */

typedef struct {
    int32_t *v;
    Py_ssize_t n, cap;
} IdBuf;

static int idbuf_push(IdBuf *b, int32_t x) {
    if (b->n == b->cap) {
        Py_ssize_t cap = b->cap ? b->cap * 2 : 4096;
        int32_t *v = PyMem_Realloc(b->v, cap * sizeof(int32_t));
        if (v == NULL) { PyErr_NoMemory(); return -1; }
        b->v = v;
        b->cap = cap;
    }
    b->v[b->n++] = x;
    return 0;
}

/* The ids of a new chunk's words (a new tuple), assigning ids to new words. */
static PyObject *new_chunk_ids(PyObject *chunk, PyObject *index, PyObject *words, PyObject *chunk_words) {
    PyObject *ws = PyObject_CallOneArg(chunk_words, chunk);
    if (ws == NULL) return NULL;
    if (!PyTuple_Check(ws)) {
        Py_DECREF(ws);
        PyErr_SetString(PyExc_TypeError, "chunk_words must return a tuple");
        return NULL;
    }
    Py_ssize_t k = PyTuple_GET_SIZE(ws);
    PyObject *ids = PyTuple_New(k);
    if (ids == NULL) { Py_DECREF(ws); return NULL; }
    for (Py_ssize_t j = 0; j < k; j++) {
        PyObject *w = PyTuple_GET_ITEM(ws, j);
        PyObject *id = PyDict_GetItemWithError(index, w);
        if (id != NULL) {
            Py_INCREF(id);
        } else {
            if (PyErr_Occurred()) goto fail;
            id = PyLong_FromSsize_t(PyList_GET_SIZE(words));
            if (id == NULL) goto fail;
            if (PyDict_SetItem(index, w, id) < 0 || PyList_Append(words, w) < 0) { Py_DECREF(id); goto fail; }
        }
        PyTuple_SET_ITEM(ids, j, id);
    }
    Py_DECREF(ws);
    return ids;
fail:
    Py_DECREF(ws);
    Py_DECREF(ids);
    return NULL;
}

static PyObject *text_ids(PyObject *mod, PyObject *args) {
    PyObject *texts, *chunks, *index, *words, *chunk_words;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O:text_ids", &PyList_Type, &texts, &PyDict_Type, &chunks, &PyDict_Type, &index,
                          &PyList_Type, &words, &chunk_words))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(texts);
    IdBuf buf = {0};
    PyObject *counts = PyList_New(n), *out = NULL;
    if (counts == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *text = PyList_GET_ITEM(texts, i);
        if (!PyUnicode_Check(text)) { PyErr_SetString(PyExc_TypeError, "texts must be str"); goto done; }
        PyObject *parts = PyUnicode_Split(text, NULL, -1);
        if (parts == NULL) goto done;
        Py_ssize_t start = buf.n;
        for (Py_ssize_t c = 0; c < PyList_GET_SIZE(parts); c++) {
            PyObject *chunk = PyList_GET_ITEM(parts, c);
            PyObject *ids = PyDict_GetItemWithError(chunks, chunk);
            if (ids != NULL) {
                Py_INCREF(ids);
            } else {
                if (PyErr_Occurred() || (ids = new_chunk_ids(chunk, index, words, chunk_words)) == NULL ||
                    PyDict_SetItem(chunks, chunk, ids) < 0) {
                    Py_XDECREF(ids);
                    Py_DECREF(parts);
                    goto done;
                }
            }
            for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(ids); j++) {
                long id = PyLong_AsLong(PyTuple_GET_ITEM(ids, j));
                if ((id == -1 && PyErr_Occurred()) || idbuf_push(&buf, (int32_t)id) < 0) {
                    Py_DECREF(ids);
                    Py_DECREF(parts);
                    goto done;
                }
            }
            Py_DECREF(ids);
        }
        Py_DECREF(parts);
        PyObject *cnt = PyLong_FromSsize_t(buf.n - start);
        if (cnt == NULL) goto done;
        PyList_SET_ITEM(counts, i, cnt);
    }
    {
        PyObject *bytes = PyBytes_FromStringAndSize((const char *)buf.v, buf.n * (Py_ssize_t)sizeof(int32_t));
        if (bytes != NULL) {
            out = PyTuple_Pack(2, bytes, counts);
            Py_DECREF(bytes);
        }
    }
done:
    PyMem_Free(buf.v);
    Py_DECREF(counts);
    return out;
}


/* Word n-gram shingles of folded texts (pipeline/shards/text.py's `shingles`, the numpy
 * passes there cost ~40 bytes of memory traffic per byte of text; this is one pass).
 * `folded` is uint8 text with NUL between documents and 32 for every separator. A word is
 * a run of other bytes, hashed as sum(byte[k] * BASE^k) mod 2^64 then fmix64; an n-gram
 * of words w0..w(n-1) as ((w0 * MUL + w1) * MUL + ...) then fmix64; a document of 1..n-1
 * words has one shingle of all its words; one under `min_words` words has none. Written
 * doc-major, in word order: the numpy path's exact values (tests/pipeline/test_text.py). */
static inline uint64_t fmix64_1(uint64_t h) {
    h ^= h >> 33; h *= 0xFF51AFD7ED558CCDULL; h ^= h >> 33; h *= 0xC4CEB9FE1A85EC53ULL; h ^= h >> 33;
    return h;
}

static PyObject *shingles(PyObject *mod, PyObject *args) {
    PyObject *src;
    int n, min_words;
    if (!PyArg_ParseTuple(args, "Oii:shingles", &src, &n, &min_words)) return NULL;
    if (n < 1) { PyErr_SetString(PyExc_ValueError, "shingles: n must be at least 1"); return NULL; }
    Py_buffer v;
    if (get_buffer(src, &v, 1, 0, "folded") < 0) return NULL;
    const unsigned char *a = v.buf;
    Py_ssize_t len = v.len, cap = len / 2 + 2, got = 0, nw = 0, wcap = 1024;
    PyObject *hb = PyByteArray_FromStringAndSize(NULL, cap * 8), *db = PyByteArray_FromStringAndSize(NULL, cap * 8);
    uint64_t *w = PyMem_RawMalloc(wcap * sizeof(uint64_t));
    int oom = 0;
    PyObject *out = NULL;
    if (hb == NULL || db == NULL || w == NULL) { PyErr_NoMemory(); goto done; }
    uint64_t *h = (uint64_t *)PyByteArray_AS_STRING(hb);
    int64_t *d = (int64_t *)PyByteArray_AS_STRING(db), doc = 0;
    const uint64_t BASE = 0x100000001B3ULL, MUL = 0x9E3779B97F4A7C15ULL;
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t i = 0;
    for (;;) {
        int end = (i >= len) || a[i] == 0;
        if (!end && a[i] != 32) {  /* a word */
            uint64_t x = 0, p = 1;
            while (i < len && a[i] != 32 && a[i] != 0) { x += (uint64_t)a[i] * p; p *= BASE; i++; }
            if (nw == wcap) {
                uint64_t *grown = PyMem_RawRealloc(w, 2 * wcap * sizeof(uint64_t));
                if (grown == NULL) { oom = 1; break; }
                w = grown;
                wcap *= 2;
            }
            w[nw++] = fmix64_1(x);
            continue;
        }
        if (end) {  /* the document's shingles */
            if (nw > 0 && nw >= min_words) {
                Py_ssize_t m = nw >= n ? nw - n + 1 : 1, k_n = nw >= n ? n : nw;
                for (Py_ssize_t s = 0; s < m; s++) {
                    uint64_t acc = w[s];
                    for (Py_ssize_t k = 1; k < k_n; k++) acc = acc * MUL + w[s + k];
                    h[got] = fmix64_1(acc);
                    d[got++] = doc;
                }
            }
            nw = 0;
            doc++;
            if (i >= len) break;
        }
        i++;
    }
    Py_END_ALLOW_THREADS
    if (oom) { PyErr_NoMemory(); goto done; }
    if (PyByteArray_Resize(hb, got * 8) < 0 || PyByteArray_Resize(db, got * 8) < 0) goto done;
    out = PyTuple_Pack(2, hb, db);
done:
    PyMem_RawFree(w);
    Py_XDECREF(hb);
    Py_XDECREF(db);
    PyBuffer_Release(&v);
    return out;
}

static PyMethodDef Splitter_methods[] = {
    {"split", (PyCFunction)Splitter_split, METH_O,
     "split(chunk) -> tuple of words, or None when the chunk is not ASCII (use the Python loop)."},
    {NULL}};

static PyTypeObject SplitterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "filters._native.Splitter",
    .tp_basicsize = sizeof(Splitter),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "spaCy's tokenizer loop for ASCII chunks (tables and callbacks from filters/words.py).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Splitter_init,
    .tp_dealloc = (destructor)Splitter_dealloc,
    .tp_methods = Splitter_methods,
};

static PyMethodDef module_methods[] = {
    {"repetition", repetition, METH_VARARGS,
     "repetition(ids, off, hash, pow, length, size, out, rules): Gopher's n-gram rules per document.\n"
     "ids int32 word ids, off int64 document offsets (n_docs + 1), hash / pow / length per vocabulary word\n"
     "(uint64, uint64, int64), size int64 characters per document,\n"
     "out int32 (written: the index of the first rule a document fails, or -1), rules a tuple of\n"
     "(n, max fraction, kind) with kind 0 for the top n-gram and 1 for duplicated n-grams."},
    {"text_ids", text_ids, METH_VARARGS,
     "text_ids(texts, chunks, index, words, chunk_words) -> (int32 ids as bytes, words per text): the word ids of\n"
     "every text, chunk by chunk (chunks: chunk -> tuple of ids, extended; index / words: the vocabulary, extended;\n"
     "chunk_words(chunk) -> tuple of words for a chunk not in chunks)."},
    {"shingles", shingles, METH_VARARGS,
     "shingles(folded, n, min_words) -> (bytearray of uint64 hashes, bytearray of int64 document indexes): the word\n"
     "n-gram shingles of NUL-separated folded texts, doc-major (pipeline/shards/text.py's shingles)."},
    {"ngram_chars", ngram_chars, METH_VARARGS,
     "ngram_chars(ids, off, hash, pow, length, n, kind, out): one rule's characters per document into out\n"
     "(int64): the top n-gram's (kind 0; 0 under n words) or the duplicated n-grams' (kind 1)."},
    {NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native",
                                    "Compiled word splitting and n-gram counting (see filters/words.py, filters/gopher.py).",
                                    -1, module_methods};

PyMODINIT_FUNC PyInit__native(void) {
    if (PyType_Ready(&SplitterType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    /* filters/words.py uses the module only when this equals its NATIVE_VERSION: a stale
     * build (the C file changed, the install not rerun) is not used */
    if (PyModule_AddIntConstant(m, "VERSION", NATIVE_VERSION) < 0 ||
        PyModule_AddObjectRef(m, "Splitter", (PyObject *)&SplitterType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
