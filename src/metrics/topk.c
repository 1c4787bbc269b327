/*
 * torch.topk's choice among tied scores, reproduced exactly.
 *
 * torch's CPU kernel (aten/src/ATen/native/TopKImpl.h) fills (value, index)
 * pairs and, with the comparator "a is NaN and b is not, or a > b", runs
 * std::partial_sort(k) when k * 64 <= n, else std::nth_element(k - 1)
 * followed by std::sort of the first k - 1. Which of several equal scores make
 * the top k, and which comes first, is whatever those libstdc++ algorithms
 * leave there: neither is stable. The functions below are the libstdc++
 * algorithms step for step (introselect, introsort with its 16-element
 * insertion-sort threshold, median-of-three pivots, heap select), so the
 * chosen indices and their order agree with torch on every input, ties and
 * NaN included (checked against torch 1.13 and 2.13 on random tie-heavy rows).
 */
#include "metrics/classify.h"

#define SORT_THRESHOLD 16

/* a ranks above b: NaN is largest. Equal values compare false both ways. */
static inline int above(const ks__scored *a, const ks__scored *b) {
  return (a->v != a->v && b->v == b->v) || a->v > b->v;
}

static inline void swap(ks__scored *a, ks__scored *b) {
  ks__scored t = *a;
  *a = *b;
  *b = t;
}

static size_t floor_log2(size_t n) {
  size_t r = 0;
  while (n >>= 1) r++;
  return r;
}

/* ---- heaps (std::__adjust_heap, __make_heap, __pop_heap, __heap_select, __sort_heap) ---- */

static void adjust_heap(ks__scored *a, size_t hole, size_t len, ks__scored value) {
  size_t top = hole, child = hole;
  while (len >= 1 && child < (len - 1) / 2) {
    child = 2 * (child + 1);
    if (above(&a[child], &a[child - 1])) child--;
    a[hole] = a[child];
    hole = child;
  }
  if ((len & 1) == 0 && len >= 2 && child == (len - 2) / 2) {
    child = 2 * (child + 1);
    a[hole] = a[child - 1];
    hole = child - 1;
  }
  size_t parent = hole ? (hole - 1) / 2 : 0;
  while (hole > top && above(&a[parent], &value)) {
    a[hole] = a[parent];
    hole = parent;
    parent = hole ? (hole - 1) / 2 : 0;
  }
  a[hole] = value;
}

static void make_heap(ks__scored *a, size_t len) {
  if (len < 2) return;
  for (size_t parent = (len - 2) / 2;; parent--) {
    adjust_heap(a, parent, len, a[parent]);
    if (parent == 0) return;
  }
}

static void pop_heap(ks__scored *a, size_t len, ks__scored *result) {
  ks__scored value = *result;
  *result = a[0];
  adjust_heap(a, 0, len, value);
}

static void heap_select(ks__scored *a, size_t middle, size_t len) {
  make_heap(a, middle);
  for (size_t i = middle; i < len; i++)
    if (above(&a[i], &a[0])) pop_heap(a, middle, &a[i]);
}

static void sort_heap(ks__scored *a, size_t len) {
  while (len > 1) {
    len--;
    pop_heap(a, len, &a[len]);
  }
}

static void partial_sort(ks__scored *a, size_t middle, size_t len) {
  heap_select(a, middle, len);
  sort_heap(a, middle);
}

/* ---- partitioning (std::__move_median_to_first, __unguarded_partition[_pivot]) ---- */

static void move_median_to_first(ks__scored *result, ks__scored *x, ks__scored *y, ks__scored *z) {
  ks__scored *m;
  if (above(x, y)) m = above(y, z) ? y : above(x, z) ? z : x;
  else m = above(x, z) ? x : above(y, z) ? z : y;
  swap(result, m);
}

static ks__scored *unguarded_partition(ks__scored *first, ks__scored *last, const ks__scored *pivot) {
  for (;;) {
    while (above(first, pivot)) first++;
    last--;
    while (above(pivot, last)) last--;
    if (!(first < last)) return first;
    swap(first, last);
    first++;
  }
}

static ks__scored *partition_pivot(ks__scored *first, ks__scored *last) {
  ks__scored *mid = first + (last - first) / 2;
  move_median_to_first(first, first + 1, mid, last - 1);
  return unguarded_partition(first + 1, last, first);
}

/* ---- insertion sorts (std::__insertion_sort, __unguarded_linear_insert) ---- */

static void unguarded_linear_insert(ks__scored *last) {
  ks__scored v = *last;
  ks__scored *next = last - 1;
  while (above(&v, next)) {
    *last = *next;
    last = next--;
  }
  *last = v;
}

static void insertion_sort(ks__scored *first, ks__scored *last) {
  if (first == last) return;
  for (ks__scored *i = first + 1; i != last; i++) {
    if (above(i, first)) {
      ks__scored v = *i;
      for (ks__scored *j = i; j != first; j--) *j = *(j - 1);
      *first = v;
    } else
      unguarded_linear_insert(i);
  }
}

/* ---- std::nth_element and std::sort ---- */

static void nth_element(ks__scored *first, ks__scored *nth, ks__scored *last) {
  if (first == last || nth == last) return;
  size_t depth = floor_log2((size_t)(last - first)) * 2;
  while (last - first > 3) {
    if (depth == 0) {
      heap_select(first, (size_t)(nth - first) + 1, (size_t)(last - first));
      swap(first, nth);
      return;
    }
    depth--;
    ks__scored *cut = partition_pivot(first, last);
    if (cut <= nth) first = cut;
    else last = cut;
  }
  insertion_sort(first, last);
}

static void introsort_loop(ks__scored *first, ks__scored *last, size_t depth) {
  while (last - first > SORT_THRESHOLD) {
    if (depth == 0) {
      partial_sort(first, (size_t)(last - first), (size_t)(last - first));
      return;
    }
    depth--;
    ks__scored *cut = partition_pivot(first, last);
    introsort_loop(cut, last, depth);
    last = cut;
  }
}

static void std_sort(ks__scored *first, ks__scored *last) {
  if (first == last) return;
  introsort_loop(first, last, floor_log2((size_t)(last - first)) * 2);
  if (last - first > SORT_THRESHOLD) {
    insertion_sort(first, first + SORT_THRESHOLD);
    for (ks__scored *i = first + SORT_THRESHOLD; i != last; i++) unguarded_linear_insert(i);
  } else
    insertion_sort(first, last);
}

/* The m best of C by a single insertion pass (m small); NaN first, equal values in index order. */
static void best_m(const float *r, size_t C, size_t stride, size_t m, ks__scored *best) {
  size_t have = 0;
  for (size_t c = 0; c < C; c++) {
    ks__scored x = {r[c * stride], c};
    if (have == m && !above(&x, &best[m - 1])) continue;
    size_t j = have < m ? have++ : m - 1;
    while (j > 0 && above(&x, &best[j - 1])) {
      best[j] = best[j - 1];
      j--;
    }
    best[j] = x;
  }
}

static int same(const ks__scored *a, const ks__scored *b) { return a->v == b->v || (a->v != a->v && b->v != b->v); }

/*
 * Fast path: when the largest score is unique and the k-th best is strictly
 * above the (k+1)-th, the set of k and its first element do not depend on any
 * tie-break, so one insertion pass answers; the callers use only those two.
 * Returns 0 when a tie decides them (the full emulation runs then).
 */
static int topk_untied(const float *r, size_t C, size_t stride, size_t k, ks__scored *work, size_t *out) {
  size_t m = k < C ? k + 1 : k;
  if (m > 16) return 0; /* the insertion pass is O(C * m): keep it for small k */
  best_m(r, C, stride, m, work);
  if (same(&work[0], &work[1]) || (m > k && same(&work[k - 1], &work[k]))) return 0;
  for (size_t j = 0; j < k; j++) out[j] = work[j].i;
  return 1;
}

void ks__topk_f32(const float *r, size_t C, size_t stride, size_t k, ks__scored *work, size_t *out) {
  if (k >= 2 && topk_untied(r, C, stride, k, work, out)) return;
  for (size_t c = 0; c < C; c++) {
    work[c].v = r[c * stride];
    work[c].i = c;
  }
  if (k * 64 <= C) {
    partial_sort(work, k, C);
  } else {
    nth_element(work, work + k - 1, work + C);
    std_sort(work, work + k - 1);
  }
  for (size_t j = 0; j < k; j++) out[j] = work[j].i;
}
