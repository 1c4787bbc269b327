/*
 * Replay driver: feeds every file of a corpus directory (recursively) to a
 * libFuzzer entry point, so the corpora run as ordinary tests under gcc and
 * under ASan+UBSan without libFuzzer. Exits non-zero when the corpus is empty.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  size_t cap = 4096, len = 0;
  uint8_t *buf = malloc(cap);
  size_t n;
  while (buf && (n = fread(buf + len, 1, cap - len, f)) > 0) {
    len += n;
    if (len == cap) {
      uint8_t *nb = realloc(buf, cap *= 2);
      if (!nb) free(buf);
      buf = nb;
    }
  }
  fclose(f);
  if (!buf) return -1;
  LLVMFuzzerTestOneInput(buf, len);
  free(buf);
  return 0;
}

static long run_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  long count = 0;
  struct dirent *e;
  char path[4096];
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    struct stat st;
    if (stat(path, &st) != 0) continue;
    long r = S_ISDIR(st.st_mode) ? run_dir(path) : run_file(path) == 0;
    if (r > 0) count += r;
  }
  closedir(d);
  return count;
}

int main(int argc, char **argv) {
  long total = 0;
  for (int i = 1; i < argc; i++) {
    long n = run_dir(argv[i]);
    if (n < 0) {
      fprintf(stderr, "replay: cannot read corpus %s\n", argv[i]);
      return 1;
    }
    total += n;
  }
  printf("replayed %ld inputs without a crash\n", total);
  return total > 0 ? 0 : 1;
}
