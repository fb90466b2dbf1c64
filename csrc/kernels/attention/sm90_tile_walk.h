// flashext: how the Hopper forward (flash_fwd_sm90.cu) walks its tiles, on the host and the device,
// so that tests/cpp checks the walk on the CPU (FlashFwd.Sm90TileWalkVisitsEveryTileOnce).
//
// A tile is (query block, head, sequence). Tile index t = (sequence · heads + head) · num_m + the
// query block counted from the last, so a CTA per tile starts the longest (causal) tiles first,
// and a persistent grid of `grid` CTAs strides over t (CTA b takes t = b, b + grid, ...).
// A causal dense call on fewer CTAs than tiles walks units instead: query blocks m and
// num_m − 1 − m of a head, whose key blocks add up to the same count for every m, so a stride over
// units balances (the middle block of an odd num_m is a unit alone). Of each 2 · grid values of t,
// the first grid are the first tiles of grid units and the next grid their second tiles, so CTA b
// takes both tiles of its unit in turn; t past the units, and the middle block's missing partner,
// are skipped. A unit's longer tile comes first, or with kShortFirst its shorter one: both tiles
// start at key block 0, so the longer one then reads the shorter one's K / V again while they are
// still in L2 (the kernel's config says where that pays). The divisors are made once on the host
// and reach the kernel as a parameter (the constant bank: nothing held in registers across the
// walk), so a tile's indices cost a few multiplies instead of 64-bit divisions. Indices are
// 31-bit: the launch takes the walk only for calls of fewer than 2^28 tiles (t stays under
// 5 · tiles).
#pragma once

#include <cstdint>

#include "../common/divmod.h"
#include "../common/macros.h"

namespace flashext {
namespace attention_detail {

struct Sm90TileWalk {
  FastDivmod num_m, heads, group, half_m, grid2;  // query blocks per head, heads, heads per KV head, units per head, 2 · grid
  int grid, num_units, loop_tiles;                // loop_tiles: the end of every CTA's stride over t
  bool paired;                                    // walking causal units
};

inline constexpr int64_t kSm90MaxTiles = int64_t(1) << 28;

// The walk of a call with `num_m` query blocks per head on a grid of `grid` CTAs; `units` asks for
// the causal units (taken only where the grid is smaller than the tile count: one CTA per tile
// needs no balance). num_m · heads · batch < kSm90MaxTiles, 1 <= grid <= that count.
inline Sm90TileWalk make_sm90_tile_walk(int num_m, int heads, int heads_kv, int batch, int grid, bool units) {
  const int tiles = num_m * heads * batch, half_m = (num_m + 1) / 2, num_units = half_m * heads * batch;
  const bool paired = units && grid < tiles;
  return Sm90TileWalk{FastDivmod(num_m), FastDivmod(heads), FastDivmod(heads / heads_kv), FastDivmod(half_m),
                      FastDivmod(2 * grid), grid, num_units,
                      paired ? 2 * grid * ((num_units + grid - 1) / grid) : tiles, paired};
}

struct Sm90TileCoords {
  int m_block, head, batch, kv_head;
  bool skip;  // an index with no tile (past the units, or the middle block's missing partner)
};

template <bool kShortFirst>
FX_HOST_DEVICE Sm90TileCoords sm90_tile_coords(const Sm90TileWalk& w, int t) {
  Sm90TileCoords at{};
  const int num_m = w.num_m.divisor;
  int hb;  // head + heads · sequence
  if (!w.paired) {
    int from_last;
    w.num_m.divmod(t, hb, from_last);
    at.m_block = num_m - 1 - from_last;
  } else {
    const int chunk = w.grid2.div(t), r = t - chunk * 2 * w.grid;
    const bool second = r >= w.grid;
    const int u = chunk * w.grid + (second ? r - w.grid : r);
    int j;
    w.half_m.divmod(u, hb, j);
    at.m_block = second != kShortFirst ? j : num_m - 1 - j;
    at.skip = u >= w.num_units || (second && j == num_m - 1 - j);
    if (at.skip) hb = 0;
  }
  w.heads.divmod(hb, at.batch, at.head);
  at.kv_head = w.group.div(at.head);
  return at;
}

}  // namespace attention_detail
}  // namespace flashext
