#include "eplb/torch_order.h"

#include <bit>
#include <cstddef>
#include <utility>

#include "core/check.h"

namespace moeserve::eplb {
namespace detail {
namespace {

// The comparator torch passes for a descending sort of non-NaN floats.
inline bool before(const Keyed& a, const Keyed& b) {
  return a.value > b.value;
}

// Quicksort stops at runs of this many elements; one insertion sort over the whole range
// finishes them. Past the first run the insertion needs no bounds check: quicksort left an
// element that sorts no later than any of the run's elements somewhere to its left.
constexpr ptrdiff_t kRunThreshold = 16;

void linear_insert_unguarded(Keyed* last) {
  Keyed v = *last;
  Keyed* next = last - 1;
  while (before(v, *next)) {
    *last = *next;
    last = next;
    --next;
  }
  *last = v;
}

void insertion_sort(Keyed* first, Keyed* last) {
  if (first == last) return;
  for (Keyed* i = first + 1; i != last; ++i) {
    if (before(*i, *first)) {
      Keyed v = *i;
      for (Keyed* p = i; p != first; --p) *p = *(p - 1);
      *first = v;
    } else {
      linear_insert_unguarded(i);
    }
  }
}

void final_insertion_sort(Keyed* first, Keyed* last) {
  if (last - first > kRunThreshold) {
    insertion_sort(first, first + kRunThreshold);
    for (Keyed* i = first + kRunThreshold; i != last; ++i) linear_insert_unguarded(i);
  } else {
    insertion_sort(first, last);
  }
}

// Moves the median of *a, *b, *c to *result (libstdc++'s __move_median_to_first).
void median_to_first(Keyed* result, Keyed* a, Keyed* b, Keyed* c) {
  Keyed* m;
  if (before(*a, *b)) {
    if (before(*b, *c)) {
      m = b;
    } else if (before(*a, *c)) {
      m = c;
    } else {
      m = a;
    }
  } else if (before(*a, *c)) {
    m = a;
  } else if (before(*b, *c)) {
    m = c;
  } else {
    m = b;
  }
  std::swap(*result, *m);
}

Keyed* partition_unguarded(Keyed* first, Keyed* last, const Keyed* pivot) {
  while (true) {
    while (before(*first, *pivot)) ++first;
    --last;
    while (before(*pivot, *last)) --last;
    if (!(first < last)) return first;
    std::swap(*first, *last);
    ++first;
  }
}

// Sift the hole at `hole` down to a leaf, then push `v` back up (libstdc++'s __adjust_heap).
void adjust_heap(Keyed* first, ptrdiff_t hole, ptrdiff_t len, Keyed v) {
  const ptrdiff_t top = hole;
  ptrdiff_t child = hole;
  while (child < (len - 1) / 2) {
    child = 2 * (child + 1);
    if (before(first[child], first[child - 1])) --child;
    first[hole] = first[child];
    hole = child;
  }
  if ((len & 1) == 0 && child == (len - 2) / 2) {
    child = 2 * (child + 1);
    first[hole] = first[child - 1];
    hole = child - 1;
  }
  ptrdiff_t parent = (hole - 1) / 2;
  while (hole > top && before(first[parent], v)) {
    first[hole] = first[parent];
    hole = parent;
    parent = (hole - 1) / 2;
  }
  first[hole] = v;
}

void make_heap(Keyed* first, Keyed* last) {
  const ptrdiff_t len = last - first;
  if (len < 2) return;
  for (ptrdiff_t parent = (len - 2) / 2;; --parent) {
    adjust_heap(first, parent, len, first[parent]);
    if (parent == 0) return;
  }
}

void heapsort(Keyed* first, Keyed* last) {
  make_heap(first, last);
  while (last - first > 1) {
    --last;
    Keyed v = *last;
    *last = *first;
    adjust_heap(first, 0, last - first, v);
  }
}

void introsort_loop(Keyed* first, Keyed* last, int depth_limit) {
  while (last - first > kRunThreshold) {
    if (depth_limit == 0) {
      heapsort(first, last);
      return;
    }
    --depth_limit;
    Keyed* mid = first + (last - first) / 2;
    median_to_first(first, first + 1, mid, last - 1);
    Keyed* cut = partition_unguarded(first + 1, last, first);
    introsort_loop(cut, last, depth_limit);
    last = cut;
  }
}

}  // namespace

void introsort_descending(std::span<Keyed> items, int depth_limit) {
  if (items.empty()) return;
  Keyed* first = items.data();
  Keyed* last = first + items.size();
  introsort_loop(first, last, depth_limit);
  final_insertion_sort(first, last);
}

void introsort_descending(std::span<Keyed> items) {
  if (items.empty()) return;
  // 2 * floor(log2(n)), as std::sort.
  const int depth = 2 * (std::bit_width(items.size()) - 1);
  introsort_descending(items, depth);
}

void heapsort_descending(std::span<Keyed> items) {
  heapsort(items.data(), items.data() + items.size());
}

}  // namespace detail

std::vector<int32_t> torch_sort_descending(std::span<const float> values) {
  std::vector<detail::Keyed> items(values.size());
  for (size_t i = 0; i < values.size(); ++i) items[i] = {values[i], static_cast<int32_t>(i)};
  detail::introsort_descending(items);
  std::vector<int32_t> order(items.size());
  for (size_t i = 0; i < items.size(); ++i) order[i] = items[i].index;
  return order;
}

int32_t torch_argmax(std::span<const float> values) {
  CHECK(!values.empty(), "argmax of an empty row");
  int32_t best = 0;
  for (size_t i = 1; i < values.size(); ++i) {
    if (values[i] > values[best]) best = static_cast<int32_t>(i);
  }
  return best;
}

}  // namespace moeserve::eplb
