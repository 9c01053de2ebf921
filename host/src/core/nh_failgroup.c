/* Failure groups (nh_failgroup.h): masks the variable parts of an error text (UUIDs, hex
 * ids, digit runs, quoted values, URL queries, a Lua error's directory) and hashes
 * endpoint + error type + masked text (FNV-1a, 48 bits) into a 12-hex-digit group id. */
#include "nh_failgroup.h"

#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef struct outbuf {
  char *p;
  size_t len, cap;
} outbuf_t;

static void put(outbuf_t *o, const char *s, size_t n)
{
  if (o->len + 1 >= o->cap) return;
  size_t room = o->cap - 1 - o->len;
  if (n > room) n = room;
  memcpy(o->p + o->len, s, n);
  o->len += n;
  o->p[o->len] = '\0';
}

static int is_word(int c) { return isalnum(c) || c == '_'; }

/* 8-4-4-4-12 hex digits */
static size_t uuid_at(const char *s)
{
  static const int groups[] = { 8, 4, 4, 4, 12 };
  size_t i = 0;
  for (int g = 0; g < 5; g++) {
    for (int k = 0; k < groups[g]; k++, i++)
      if (!isxdigit((unsigned char)s[i])) return 0;
    if (g < 4) {
      if (s[i] != '-') return 0;
      i++;
    }
  }
  return is_word((unsigned char)s[i]) ? 0 : i;
}

/* A closing quote on the same line, followed by something that is not a letter (so
 * the apostrophe in "can't" opens nothing). Returns the length including both quotes. */
static size_t quoted_at(const char *s)
{
  char q = s[0];
  for (size_t i = 1; s[i] && s[i] != '\n' && i < 400; i++) {
    if (s[i] == '\\' && s[i + 1]) {
      i++;
      continue;
    }
    if (s[i] == q) return is_word((unsigned char)s[i + 1]) ? 0 : i + 1;
  }
  return 0;
}

void nh_failgroup_mask(const char *text, char *out, size_t outlen)
{
  outbuf_t o = { out, 0, outlen };
  if (outlen) out[0] = '\0';
  if (!text) return;
  const char *s = text;
  /* "dir/adapter.lua:17: ..." (a Lua error's position): the directory varies with where
   * the adapter is installed, not with the failure; keep the file name */
  size_t pos = strcspn(s, " :\n");
  if (s[pos] == ':' && pos > 4) {
    const char *slash = NULL;
    for (const char *p = s; p < s + pos; p++)
      if (*p == '/') slash = p;
    if (slash && strncmp(s + pos - 4, ".lua", 4) == 0) s = slash + 1;
  }
  while (*s && *s != '\n') {
    unsigned char c = (unsigned char)*s;
    int word_start = s == text || !is_word((unsigned char)s[-1]);
    size_t n;
    if (word_start && isxdigit(c) && (n = uuid_at(s))) {
      put(&o, "<uuid>", 6);
      s += n;
    } else if ((c == '"' || c == '\'') && word_start && (n = quoted_at(s))) {
      put(&o, c == '"' ? "\"<s>\"" : "'<s>'", 5);
      s += n;
    } else if (c == '?' && s[1] && !isspace((unsigned char)s[1]) && s != text && !isspace((unsigned char)s[-1])) {
      put(&o, "?<q>", 4);
      while (*s && !isspace((unsigned char)*s)) s++;
    } else if (word_start && is_word(c)) {
      /* a word: a hex id (6+ hex digits, one of them a digit) goes whole; otherwise
       * only its digit runs are masked (erp-7 -> erp-<n>, utf8 -> utf<n>) */
      size_t len = 0, digits = 0, hex = 1;
      while (is_word((unsigned char)s[len])) {
        if (isdigit((unsigned char)s[len])) digits++;
        if (!isxdigit((unsigned char)s[len])) hex = 0;
        len++;
      }
      if (hex && digits && len >= 6) {
        put(&o, "<id>", 4);
      } else {
        for (size_t i = 0; i < len;) {
          if (isdigit((unsigned char)s[i])) {
            put(&o, "<n>", 3);
            while (i < len && isdigit((unsigned char)s[i])) i++;
          } else {
            put(&o, s + i, 1);
            i++;
          }
        }
      }
      s += len;
    } else {
      put(&o, s, 1);
      s++;
    }
  }
  /* trailing blanks would split a group on a stray newline or space */
  while (o.len && isspace((unsigned char)out[o.len - 1])) out[--o.len] = '\0';
}

static uint64_t fnv1a(uint64_t h, const char *s)
{
  for (; s && *s; s++) {
    h ^= (unsigned char)*s;
    h *= 1099511628211ULL;
  }
  h ^= 0xff;   /* field separator: ("ab", "c") and ("a", "bc") differ */
  h *= 1099511628211ULL;
  return h;
}

void nh_failgroup_id(const char *endpoint, const char *error_type, const char *error_text,
                     char out[NH_FAILGROUP_ID_LEN + 1])
{
  char masked[512];
  nh_failgroup_mask(error_text, masked, sizeof masked);
  uint64_t h = 14695981039346656037ULL;
  h = fnv1a(h, endpoint);
  h = fnv1a(h, error_type);
  h = fnv1a(h, masked);
  snprintf(out, NH_FAILGROUP_ID_LEN + 1, "%012llx", (unsigned long long)(h & 0xffffffffffffULL));
}
