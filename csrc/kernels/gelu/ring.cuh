// flashext GeLU epilogues: a thread's private ring of shared-memory slots, filled by cp.async, as
// the few-rows kernels stream their rows (the 16-bit forward in one wave, the one-pass backward).
//
// Each thread owns kStages slots; row k of the thread goes to slot k % kStages in a commit group
// of its own. Only the thread fills and reads its slots, so cp.async.wait_group<kStages − 1>
// before reading row k orders them, with no barrier. Why a ring and not registers: loads into
// registers issued together share one scoreboard, and the first use of any of them waits for the
// last; here row k is computed as soon as rows 0 … k have landed.
//
//   ring_prologue: rows 0 … kStages − 1 requested, one group per slot (empty past the thread's
//                  last row), so the group count stays kStages ahead of the row being read.
//   ring_rows:     for each row k: wait for it, result = compute(k, slot), refill the slot with
//                  row k + kStages (or commit an empty group), store(k, result).
// The groups left at the end are empty.
#pragma once

#include "../common/macros.h"
#include "../common/ptx.cuh"

namespace flashext {
namespace gelu_detail {

// issue(k): cp.async of the thread's row k into slot k % kStages. Count: the kernel's row type.
template <int kStages, typename Count, typename Issue>
FX_DEVICE void ring_prologue(Count rows, Issue&& issue) {
#pragma unroll
  for (int k = 0; k < kStages; ++k) {
    if (k < rows) issue(Count(k));
    ptx::cp_async_commit();
  }
}

// compute(k, slot) reads row k's slot and returns its result; store(k, result) writes it out.
template <int kStages, typename Count, typename Issue, typename Compute, typename Store>
FX_DEVICE void ring_rows(Count rows, Issue&& issue, Compute&& compute, Store&& store) {
  for (Count k = 0; k < rows; ++k) {
    ptx::cp_async_wait<kStages - 1>();  // row k has landed
    const auto result = compute(k, int(k % kStages));
    // result depends on the slot's values, so they have been read: the barrier keeps the compiler
    // from moving those reads below the copy that overwrites the slot.
    asm volatile("" ::: "memory");
    if (k + kStages < rows) issue(k + kStages);
    ptx::cp_async_commit();
    store(k, result);
  }
}

}  // namespace gelu_detail
}  // namespace flashext
