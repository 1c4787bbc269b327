/* Reading the gzip'd digits CSV with zlib. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "digits.h"

static int parse_row(char *line, float *x, int64_t *y) {
  char *p = line;
  for (int i = 0; i <= DIGITS_PIXELS; i++) {
    char *end;
    long v = strtol(p, &end, 10);
    if (end == p || v < 0 || v > 16 || (i == DIGITS_PIXELS && v > 9)) return -1;
    if (i < DIGITS_PIXELS) x[i] = (float)v / 16.0f;
    else *y = v;
    p = end + (*end == ',');
  }
  return 0;
}

/*
 * The fixed split: every 5th row (0, 5, 10, ...; 360 rows) evaluates, the rest
 * train. Rows are reordered train-first so each part is one contiguous block.
 * Interleaving keeps both parts drawn from all writers; the file's tail comes
 * from writers unseen elsewhere and would measure something else.
 */
static int split(digits_data *d) {
  float *x = malloc(sizeof(float) * DIGITS_ROWS * DIGITS_PIXELS);
  int64_t *y = malloc(sizeof(int64_t) * DIGITS_ROWS);
  if (!x || !y) {
    free(x);
    free(y);
    return -1;
  }
  size_t tr = 0, ev = DIGITS_ROWS - DIGITS_EVAL_ROWS;
  for (size_t i = 0; i < DIGITS_ROWS; i++) {
    size_t to = i % 5 == 0 ? ev++ : tr++;
    memcpy(x + to * DIGITS_PIXELS, d->x + i * DIGITS_PIXELS, sizeof(float) * DIGITS_PIXELS);
    y[to] = d->y[i];
  }
  free(d->x);
  free(d->y);
  d->x = x;
  d->y = y;
  return 0;
}

int digits_load(const char *path, digits_data *d) {
  memset(d, 0, sizeof *d);
  gzFile f = gzopen(path, "rb");
  if (!f) {
    fprintf(stderr, "keepsake-digits: cannot open %s\n", path);
    return -1;
  }
  d->x = malloc(sizeof(float) * DIGITS_ROWS * DIGITS_PIXELS);
  d->y = malloc(sizeof(int64_t) * DIGITS_ROWS);
  char line[1024];
  while (d->x && d->y && d->n < DIGITS_ROWS && gzgets(f, line, sizeof line)) {
    if (parse_row(line, d->x + d->n * DIGITS_PIXELS, d->y + d->n)) break;
    d->n++;
  }
  gzclose(f);
  if (d->n == DIGITS_ROWS && split(d)) d->n = 0;
  if (d->n != DIGITS_ROWS) {
    fprintf(stderr, "keepsake-digits: %s: expected %d rows of 65 values, read %zu\n", path, DIGITS_ROWS, d->n);
    digits_free(d);
    return -1;
  }
  return 0;
}

void digits_free(digits_data *d) {
  free(d->x);
  free(d->y);
  memset(d, 0, sizeof *d);
}
