// Orderings that decide ties exactly as PyTorch's CPU kernels do, so that the plans of
// rebalance.h match DeepSeek's eplb.py bit for bit (docs/eplb.md, "Tie-breaking").
//
// torch.sort(descending=True) on CPU without stable=True runs libstdc++'s std::sort (introsort:
// median-of-three quicksort down to 16-element runs, heapsort past a depth limit, then one
// insertion sort) on (value, index) pairs that start in index order, comparing values only. For
// 16 items or fewer that is an insertion sort and keeps equal values in index order; above 16 it
// does not. This file re-implements that algorithm step for step, independent of the standard
// library this build uses. torch.max(dim).indices returns the first index of the maximum.
//
// Pure functions, callable from any thread. Values must not be NaN (callers validate input).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace moeserve::eplb {

// Indices 0..n-1 ordered by value descending, ties resolved as torch.sort(descending=True) on CPU.
std::vector<int32_t> torch_sort_descending(std::span<const float> values);

// Index of the first largest value, as torch.max(dim).indices; values must be non-empty.
int32_t torch_argmax(std::span<const float> values);

namespace detail {

// One (value, index) element of the sort; compared by value only.
struct Keyed {
  float value;
  int32_t index;
};

// libstdc++'s std::sort on `items` with comparator "a.value > b.value".
void introsort_descending(std::span<Keyed> items);
// libstdc++'s std::partial_sort(first, last, last) (heap select + sort_heap), the fallback
// introsort takes past its depth limit; exposed so tests can compare it on its own.
void heapsort_descending(std::span<Keyed> items);
// As introsort_descending with an explicit depth limit (tests force the heapsort fallback).
void introsort_descending(std::span<Keyed> items, int depth_limit);

}  // namespace detail
}  // namespace moeserve::eplb
