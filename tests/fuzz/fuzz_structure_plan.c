/*
 * libFuzzer target: the read side of the value tree (ks_structure_plan, include/keepsake/binding.h).
 * Input: one byte (bit 0: the records are a structure document, else a keepsake 0.1.0 pytree table;
 * bit 1: no records; bit 2: prefix "p/"), the records' text up to a NUL, then entry names one per
 * line. Any input is refused with a status or planned; a plan's nodes must form a tree within the
 * bounds the header gives: each child index in range and reached once, leaves naming an entry
 * under the prefix, no deeper than KS_PLAN_MAX_DEPTH, and no more nodes than name components plus
 * recorded folders allow.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "keepsake/binding.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void walk(const ks_plan *p, size_t id, unsigned depth, unsigned char *seen, size_t n_names,
                 const size_t *lens, size_t prefix_len) {
  const ks_plan_node *o = ks_plan_at(p, id);
  if (!o || seen[id] || depth > KS_PLAN_MAX_DEPTH + 1) abort();
  seen[id] = 1;
  if (o->tag == KS_PLAN_LEAF) {
    if (o->name >= n_names || lens[o->name] < prefix_len) abort();
    return;
  }
  for (size_t i = 0; i < o->n; i++) walk(p, ks_plan_child(p, o->first + i), depth + 1, seen, n_names, lens, prefix_len);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  unsigned mode = data[0];
  const char *text = (const char *)data + 1;
  size_t rest = size - 1;
  const char *nul = memchr(text, 0, rest);
  size_t rec_len = nul ? (size_t)(nul - text) : rest;
  const char *list = nul ? nul + 1 : text + rest;
  size_t list_len = nul ? rest - rec_len - 1 : 0;
  size_t cap = 1;
  for (size_t i = 0; i < list_len; i++) cap += list[i] == '\n';
  const char **names = malloc(cap * sizeof *names);
  size_t *lens = malloc(cap * sizeof *lens), n = 0;
  for (size_t i = 0, start = 0; list_len && i <= list_len; i++) {
    if (i == list_len || list[i] == '\n') {
      names[n] = list + start, lens[n++] = i - start;
      start = i + 1;
    }
  }
  const char *doc = (mode & 2) ? NULL : (mode & 1) ? text : NULL;
  const char *table = (mode & 2) ? NULL : (mode & 1) ? NULL : text;
  const char *prefix = (mode & 4) ? "p/" : "";
  ks_plan *p = NULL;
  ks_status st = ks_structure_plan(doc, doc ? rec_len : 0, table, table ? rec_len : 0, names, lens, n, prefix, NULL,
                                   &p, NULL);
  if (!st) {
    size_t nodes = 0;
    while (ks_plan_at(p, nodes)) nodes++;
    if (nodes > 1 + list_len + n + rec_len) abort(); /* bounded by the input */
    unsigned char *seen = calloc(nodes, 1);
    walk(p, 0, 0, seen, n, lens, strlen(prefix));
    free(seen);
  } else if (p) {
    abort();
  }
  ks_plan_free(p);
  free(names);
  free(lens);
  return 0;
}
