// The launch-plan tables: which kernel configuration runs for a row of a given
// length. Kept apart from the kernels so that tuning is an edit of one table.
//
// Tables are per GPU family where a kernel's features differ by family (the
// backward's copies: the bulk copy engine from sm_90, cp.async from sm_80,
// plain loads on sm_75); the forward uses plain loads everywhere and has one
// table. The family is that of the code the GPU runs (the kernels' PTX
// version: a compute_80 build on an H200 is family 80), see dispatch.cuh.
//
// Rows are keyed by the row length in 16-byte vectors (nvec = N * sizeof(x) /
// 16: 8 elements for bf16/f16, 4 for f32). The first row whose max_nvec >= nvec
// is used. A row past the end of a table goes to that direction's fallback
// (looped forward, split backward), which handles any N.
//
//   block:  threads per block.
//   group:  threads that share one row. group <= 32 reduces with shuffles only
//           and a block works on block/group rows per step (small N, QK-norm);
//           group == block puts one row in a block (mid N).
//   chunks: 16-byte vectors each thread holds per row (registers), so one
//           row is group * chunks vectors long at most.
//   stages: (backward) steps of x and g in shared memory: one being
//           computed on, stages - 1 in flight.
//   bulk:   (backward) a step's rows arrive through the bulk copy engine
//           (one thread issues them) instead of per-thread 16-byte copies.
//   cluster: (backward, tuner only: see below kBackwardSm90) blocks of a
//           thread-block cluster that split one row by columns.
//   persistent: (forward) the grid is what stays resident and walks the
//           rows; false: a block per step of rows, the hardware refills SMs.
#pragma once

#include <cstddef>
#include <iterator>

namespace rmsnorm::plans {

struct RowPlan {
  int max_nvec;
  int block;
  int group;
  int chunks;
  int stages = 1;     // backward: shared-memory stages of x and g;
                      // forward: rows in registers at once (next one loading)
  bool bulk = false;  // (backward) whole steps through the bulk copy engine
  int cluster = 1;    // (backward) blocks that share a row
  bool persistent = true;  // (forward) grid = resident blocks
  int min_steps = 1;  // (LayerNorm backward) steps of rows a unit walks at
                      // least: caps the grid, so the partial rows, at few rows
  int min_blocks = 0;  // (LayerNorm backward) blocks a SM that the kernel's
                       // registers must allow (__launch_bounds__); 0: no cap
};

// Dynamic shared memory of one persistent-backward block for rows of nvec
// 16-byte vectors of x, g being g_per_x times as wide as x (1 or 2).
inline std::size_t persistent_smem(const RowPlan& p, int nvec, int g_per_x) {
  const std::size_t slice = (nvec + p.cluster - 1) / p.cluster;
  return std::size_t(p.stages) * (p.block / p.group) * slice * 16 * (1 + g_per_x);
}

// Backward, persistent kernel (x and g staged in shared memory, gw partial in
// fp32 registers). Register budget: per thread 2 * chunks * VEC floats (w and
// the gw partial) stay live across the whole row loop, so chunks grows with
// the block only up to 4 (64 live floats for bf16, ~100 registers) before
// spilling. Shared memory per block is stages * rows/step * N * (sizeof x +
// sizeof g): at N = 16384 bf16 two stages take 128 KiB (one block per SM);
// beyond it the split plan takes over (see below the table).
//
// Entries are chosen with cuda/cli/tune_backward (H200, bf16, kernel alone,
// CUDA events, % of our copy ceiling at the benchmark shapes; docs/NOTES.md
// has the tables):
// - Two stages everywhere: a third (more bytes in flight, fewer resident
//   blocks) lost 1-6% at every shape tried, ncu shows DRAM already 75-80%
//   busy with two.
// - Bulk copies (one thread per step, the copy engine moves the rows) where
//   they win: 16384x8192 219 vs 235 us, 8192x16384 221 vs 236, 65536x1024
//   110 vs 120, 262144x128 57 vs 59. Per-thread cp.async copies cost each
//   thread two instructions and an address per 16 bytes; at large N that
//   issue work competes with the math. At N = 2048..4096 per-thread copies
//   stay ahead (32768x2048 108 vs 116 us, 16384x2880 80 vs 84, 16384x4096
//   126 vs 128).
// - Small blocks with many resident (N <= 1024: 128 threads, 10 a SM) beat
//   a warp per row with 8 rows a step (110 vs 115 us at 65536x1024).
inline constexpr RowPlan kBackwardSm90[] = {
    {4, 128, 4, 1, 2},             // N <= 32 bf16: 32 rows a step, 4 lanes a row
    {8, 128, 8, 1, 2},             // N <= 64
    {16, 128, 16, 1, 2, true},     // N <= 128: 8 rows a step (QK-norm head dims)
    {32, 256, 32, 1, 2},           // N <= 256: a warp per row
    {64, 256, 32, 2, 2},           // N <= 512
    {128, 128, 128, 1, 2, true},   // N <= 1024: a block per row from here on
    {256, 256, 256, 1, 2},         // N <= 2048
    {512, 256, 256, 2, 2},         // N <= 4096
    {640, 320, 320, 2, 2},         // N <= 5120: sized to the row (see below)
    {1024, 512, 512, 2, 2, true},  // N <= 8192: the seed's shape
    {2048, 512, 512, 4, 2, true},  // N <= 16384
};
// Families 80 and 75 (A100, A10, RTX 30xx/40xx, L4, T4): the same rows with
// per-thread copies, as no copy engine is there (on sm_75 the copies are
// plain 16-byte loads and stores, so a stage is not overlapped). Not tuned on
// those GPUs (none was at hand): measured as PTX on the H200
// (docs/NOTES.md). Rows whose stages exceed a GPU's shared memory (sm_75:
// 64 KiB a block, sm_86/sm_120: 99 KiB) get no resident block there, and the
// planner falls back to the split plan.
inline constexpr RowPlan kBackwardSm80[] = {
    {4, 128, 4, 1, 2},     {8, 128, 8, 1, 2},     {16, 128, 16, 1, 2},
    {32, 256, 32, 1, 2},   {64, 256, 32, 2, 2},   {128, 128, 128, 1, 2},
    {256, 256, 256, 1, 2}, {512, 256, 256, 2, 2}, {640, 320, 320, 2, 2},
    {1024, 512, 512, 2, 2}, {2048, 512, 512, 4, 2},
};
// Rows past N = 16384 bf16 take the split plan. A one-pass kernel that
// spreads a row over a thread-block cluster exists (bwd_persistent_cluster;
// cuda/cli/tune_backward measures it: 4096x32768 in 235 us, 87% of our copy
// kernel, and 242-250 us through MLX, 2.1x the built-in, against 1.55x for
// split), but it is not launched through MLX: MLX caches instantiated CUDA
// graphs and updates them in place with the next graph of the same shape,
// and a node's cluster shape stayed with the updated node, so a plain kernel
// that later took that node's place launched in the stale cluster shape and
// did not run (H200, full test suite: gx left unwritten for float32 and
// small grids, with the shape as a launch attribute or compiled in alike).
// Cluster rows need a launch that MLX will not fold into an updated graph.

// Forward (row in registers; see fwd_rows). Chosen with cuda/cli/tune_forward
// (H200, bf16, kernel alone, % of a device-to-device copy of x):
// - Up to N = 512 a persistent grid with w in fp32 registers (262144x128:
//   42.9 us, 93% of the copy; a block per step 44.5). Short rows make many
//   steps, and reading w once per block saves a weight load per row.
// - From N = 1024 a block per row, small blocks, w read after the reduction
//   (96-101% of the copy: 65536x1024 70.5 us, 32768x2048 69.7, 16384x2880
//   51.9, 16384x8192 137.8, 8192x16384 135.2), against 61-87% for the
//   persistent grid: w in registers caps residency (2 blocks of 256 a SM at
//   N = 8192), so too few bytes are in flight, and a block that finishes a
//   row idles until its next row arrives (two rows in flight, stages 2, won
//   back only a few percent).
// - N <= 32768: a 1024-thread block per row, 4 chunks a thread. Such a
//   block gets 64 registers a thread: x fits, w in registers would not (the
//   persistent kernel), nor would 8 chunks (ptxas spills 184 bytes), so
//   longer rows go to the looped kernel.
// - N = 2560 and 5120 (hidden sizes that are not a power of two): a row
//   sized to them, 160 threads x 2 or 4 chunks (2560: 8192 rows 27.2 vs
//   28.6 us with the N <= 4096 row; 5120: 8192 rows 47.4 vs 51.1 us for
//   the built-in's shape, 128 x 5, and 32768 rows 167.1 vs 174.7). Under ncu
//   (8192x5120) 128 x 5 took 70 registers, so 7 blocks (896 threads) a SM
//   and 68% of DRAM peak, against the built-in's same shape in 54 registers
//   (1152 threads, 76%); 160 x 4 takes 56 (7 blocks, 1120 threads).
//   Capping 128 x 5 at 64 registers spilled and gained half of that.
// Fields: {max_nvec, block, group, chunks, stages, -, -, persistent}.
constexpr bool kPersistent = true, kPerStep = false;
inline constexpr RowPlan kForward[] = {
    {4, 128, 4, 1, 1, false, 1, kPersistent},      // N <= 32 bf16
    {8, 128, 8, 1, 1, false, 1, kPersistent},      // N <= 64
    {16, 256, 16, 1, 1, false, 1, kPersistent},    // N <= 128
    {32, 256, 32, 1, 1, false, 1, kPersistent},    // N <= 256
    {64, 256, 32, 2, 1, false, 1, kPersistent},    // N <= 512
    {128, 64, 64, 2, 1, false, 1, kPerStep},       // N <= 1024
    {256, 128, 128, 2, 1, false, 1, kPerStep},     // N <= 2048
    {320, 160, 160, 2, 1, false, 1, kPerStep},     // N <= 2560 (see below)
    {512, 128, 128, 4, 1, false, 1, kPerStep},     // N <= 4096
    {640, 160, 160, 4, 1, false, 1, kPerStep},     // N <= 5120 (see below)
    {1024, 256, 256, 4, 1, false, 1, kPerStep},    // N <= 8192
    {2048, 512, 512, 4, 1, false, 1, kPerStep},    // N <= 16384
    {4096, 1024, 1024, 4, 1, false, 1, kPerStep},  // N <= 32768
};

// Forward, one wave of rows (decode: a token's 1-64 rows, at most one step
// of rows per SM): a call is one row's latency, not bandwidth, and the rows
// above were sized for bandwidth. Chosen with cuda/cli/tune_decode (H200,
// bf16, 200 back-to-back launches in a CUDA graph, as in a decode step's
// chain, us per launch at 1 / 16 / 64 rows; docs/h200/2026-12-01-5bbb625/tune-decode-*.log):
// - w is loaded beside x (fwd_rows PERSISTENT), never after the reduction:
//   that costs a second round trip, 1x4096 2.16 vs 2.56 us (128 x 4).
// - One 16-byte vector a thread (the block is the row) up to N = 5120:
//   1x1024 128 x 1 1.56 us against 64 x 2 1.77 and a warp of 4 chunks 1.82;
//   1x2048 256 x 1 1.80 vs 128 x 2 1.98; 1x2560 320 x 1 1.85 vs 160 x 2
//   2.03; 1x4096 512 x 1 2.00 vs 256 x 2 2.11, 128 x 4 2.16; 1x5120 640 x 1
//   2.12 vs 320 x 2 2.20, 160 x 4 2.31. The same order at 16 and 64 rows.
//   Not profiled; likely, fewer chunks a thread is a shorter chain of
//   dependent work per thread, and more warps issue the row's loads.
// - At N = 8192 the row above (256 x 4, w first) stays: 2.41 us, 512 x 2
//   2.42, 1024 x 1 2.54 (the block-wide reduction over 32 warps).
// Up to N = 512 the rows are the table's above (a group of lanes per row,
// w in registers already). Past this table, one wave takes the row above
// with w first (forward.cu).
inline constexpr RowPlan kForwardOneWave[] = {
    kForward[0], kForward[1], kForward[2], kForward[3], kForward[4],
    {128, 128, 128, 1, 1, false, 1, kPersistent},  // N <= 1024 bf16
    {256, 256, 256, 1, 1, false, 1, kPersistent},  // N <= 2048
    {320, 320, 320, 1, 1, false, 1, kPersistent},  // N <= 2560
    {512, 512, 512, 1, 1, false, 1, kPersistent},  // N <= 4096
    {640, 640, 640, 1, 1, false, 1, kPersistent},  // N <= 5120
};

// LayerNorm (row_math.cuh LayerRow; planned in layer_norm.cu): the same walks
// with LayerNorm rows of their own. Chosen with cuda/cli/layer_norm_bench
// (H200, bf16, the chain as planned: walk + one column sum of gw and gb; a
// CUDA graph of 20 back-to-back calls over inputs several times the L2, us
// per call, median of 15; docs/h200/2026-12-01-20c7c90/ has both runs,
// run2-bench.log the final figures quoted here, "RMS" = our RMSNorm chain in
// the same run).
// - Backward. LayerRow takes one block reduction a row (four sums about a
//   shift) where the two-pass policy took two, and keeps its fp32 weight in
//   shared memory, so its registers hold the gw and gb partials where
//   RMSNorm's hold gw and the weight. The rows that matter after that are the
//   ones that leave fewer partial rows: every unit writes 2 N fp32 and the
//   column sum reads them back, at 8192 rows up to 30% of the bytes of x, g
//   and gx with a small block a unit. Hence several rows a step (block /
//   group > 1: the block adds its rows' partials before storing one row of
//   each) at mid N:
//     N <= 1024: a warp a row, 4 rows a step, 123 registers, 4 blocks a SM
//       (528 units): 8192x768 17.9 us (RMS 17.4), 8192x1024 21.5 (RMS 20.4);
//       the RMSNorm row 128 x 1 took 24.7 / 27.7 (1320 units).
//     N <= 1536: 3 rows a step of 64 x 3 (396 units): 16384x1280 45.5 (RMS
//       45.4) against 49.1 for the N <= 2048 row; 4 rows of 64 x 4 45.6, a
//       block of 160 x 1 a row 58.0.
//     N <= 2048: 2 rows a step of 128 x 2 (396 units): 16384x1280 49.6 (RMS
//       45.1), 8192x2048 36.8 (RMS 32.0); a block a row of 128 x 2 (924
//       units) 51.7 / 39.1, RMSNorm's 256 x 1 71.4 / 47.1.
//     N <= 3072: 128 x 3, bulk: 8192x2880 50.1 (RMS 42.6), 8192x2560 46.7
//       (RMS 39.3); 192 x 2 with per-thread copies, before, 52.0 / 47.6; the
//       N <= 4096 row 55.9 / 54.3.
//     N <= 4096: 256 x 2, bulk, three stages: 8192x4096 61.0 (RMS 60.9),
//       16384x4096 111.1 (RMS 115.8); two stages 61.9 / 114.4.
//     N <= 5120: 160 x 4, bulk: 8192x5120 75.2 (RMS 68.0); RMSNorm's 320 x 2
//       row, before, 81.2, with three stages 76.3.
//     N <= 8192: 256 x 4 (123 registers, 2 blocks a SM): 4096x8192 64.5
//       (RMS 58.5), 16384x8192 207.0 (RMS 206.8); RMSNorm's 512 x 2 capped
//       at 64 registers 67.2 / 224.8, uncapped (81 registers, 1 block a SM)
//       82.7 / 284.0.
//     N <= 16384: RMSNorm's 512 x 4 (123 registers): 8192x16384 223.1 (RMS
//       204.1); 1024 x 2 238.9.
//   Before (two passes, RMSNorm's rows with 1024 x 1 x 3 stages at N = 8192,
//   two column-sum launches): 24.8, 28.8, 67.8, 46.4, 68.6, 75.6, 136.3,
//   84.5, 295.0, 274.9 us at the shapes above in that order.
//   (The rows of N <= 1536, 3072 and 5120: the standalone bench,
//   cuda/cli/layer_norm_bench, docs/h200/2026-12-02-bfea2ae/layer-norm-bench.log.)
//   Where the stages and the weight do not fit a block (16-bit x, fp32 g
//   past N = 8192) the weight stays in registers (kLayerBackwardWRegs*:
//   8192x16384 bf16 269.8 us, 64 registers and 32 bytes of stack).
// - Forward: LayerRow on RMSNorm's rows, except a warp a row at N <= 768
//   (8192x768 11.0 us against 12.9 for 64 x 2; RMS 9.1) and 512 x 4 capped
//   at 64 registers (2 blocks a SM) at N <= 16384 (8192x16384 169.3 against
//   230.7 uncapped; RMS 131.4). Elsewhere a cap spilled (ptxas: 32-128 bytes
//   of stack; ncu: local-memory requests) and lost (8192x1024: 19.3 us at 24
//   blocks a SM against 13.9), and the one reduction a row gained little
//   against the two-pass policy (within 4% either way, 13.8 -> 13.9 at
//   8192x1024, 167.8 -> 161.3 at 16384x8192). What held the forward at
//   1.2-1.5x RMSNorm's was registers, not the reduction: 64 against 40 a
//   thread at 128 x 2, 78 against 63 at 256 x 4 (b beside w, both widened
//   to fp32 as they arrive, and the shift's first vector held from the
//   loads on), so fewer resident blocks (ncu, 32768x1280: 50% against 75%
//   theoretical occupancy, 42.7% against 65% of DRAM peak, 72.2 us against
//   46.4). Reading w and b in x's dtype (fwd_rows W_AS_X, where both are
//   given in it) and the first vector again at the reduction: 47 and 63
//   registers, 59.0 us there (62.5% occupancy), 16384x8192 160 -> 131.7 us
//   (RMS 127); through MLX 0.77-1.20x RMSNorm's forward at the training
//   shapes, 1.20x at most (N = 1280), at or below 1.05x from N = 4096
//   (docs/h200/2026-12-02-7410df2: profile-ln.log, bench-ln.log). What is
//   left at N = 1280-2560 is not residency: 128 x 2 capped at RMSNorm's 40
//   registers (12 blocks a SM) ran as the 47-register row (16384x1280 31.6
//   against 31.5 us, RMS 25.9) and a chunk a thread (160 / 256 / 320 x 1)
//   lost (35.4-44.6 us; docs/h200/2026-12-02-1830c05/layer-norm-bench.log).
// Rows past a table, and N not a multiple of a 16-byte vector, go to
// mx.fast.layer_norm (the op decides before building the graph, layer_norm.cpp).
// add_layer_norm (AddLayerRow) runs these rows, its forward uncapped
// (layer_norm.cu says why).
inline constexpr RowPlan kLayerBackwardSm90[] = {
    kBackwardSm90[0], kBackwardSm90[1], kBackwardSm90[2], kBackwardSm90[3],
    kBackwardSm90[4],                   // N <= 512 bf16: RMSNorm's rows
    {128, 128, 32, 4, 2, true},         // N <= 1024: a warp a row, 4 rows a step
    {192, 192, 64, 3, 2, true},         // N <= 1536: 3 rows a step of 64 x 3
    {256, 256, 128, 2, 2, true},        // N <= 2048: 2 rows a step of 128 x 2
    {384, 128, 128, 3, 2, true},        // N <= 3072
    {512, 256, 256, 2, 3, true},        // N <= 4096
    {640, 160, 160, 4, 2, true},        // N <= 5120
    {1024, 256, 256, 4, 2, true},       // N <= 8192
    kBackwardSm90[10],                  // N <= 16384: RMSNorm's row
};
// Families 80 and 75: the same rows with per-thread copies (not measured).
inline constexpr RowPlan kLayerBackwardSm80[] = {
    kBackwardSm80[0], kBackwardSm80[1], kBackwardSm80[2], kBackwardSm80[3],
    kBackwardSm80[4],
    {128, 128, 32, 4, 2},  {192, 192, 64, 3, 2},  {256, 256, 128, 2, 2},
    {384, 128, 128, 3, 2}, {512, 256, 256, 2, 3}, {640, 160, 160, 4, 2},
    {1024, 256, 256, 4, 2},
    kBackwardSm80[10],
};
inline constexpr RowPlan kLayerBackwardWRegsSm90[] = {{2048, 1024, 1024, 2, 2, true}};
inline constexpr RowPlan kLayerBackwardWRegsSm80[] = {{2048, 1024, 1024, 2, 2}};
// Forward: {max_nvec, block, group, chunks, stages, -, -, persistent, -,
// min_blocks}.
inline constexpr RowPlan kLayerForward[] = {
    kForward[0], kForward[1], kForward[2], kForward[3], kForward[4],  // N <= 512
    {96, 128, 32, 4, 1, false, 1, kPerStep},           // N <= 768: a warp a row
    kForward[5],                                       // N <= 1024
    kForward[6],                                       // N <= 2048
    kForward[7],                                       // N <= 2560 (not measured)
    kForward[8],                                       // N <= 4096
    kForward[9],                                       // N <= 5120 (not measured)
    kForward[10],                                      // N <= 8192
    {2048, 512, 512, 4, 1, false, 1, kPerStep, 1, 2},  // N <= 16384: <= 64 registers
    kForward[12],                                      // N <= 32768 (not measured)
};

// The fused residual add (add_rms_norm) runs the rows above, forward and
// backward, rather than tables of its own: its row is the norm's row (h takes
// x's place in registers or in the stages), so the table's bounds (register
// budget, row split) hold unchanged, and its extra operands (residual and h in
// the forward, gh in the backward) add bytes per row in the same proportion at
// every N, which the rows were chosen to keep in flight. In the backward gh
// takes one more x-sized slot per stage (persistent_smem's g_per_x + 1): where
// that no longer fits a block (N = 16384 with fp32 g) the split plan takes the
// row, as for the plain norm past the table. Not re-tuned by a tuner run
// (docs/fused-add.md has the measurements there are).

// Fallbacks (any N, any alignment; VEC = 1 when N or a pointer is not 16-byte
// friendly).
inline constexpr int kLoopedBlock = 512;  // forward, a block per row, 2 reads
inline constexpr int kNaiveBlock = 256;   // the seed's per-row kernel
inline constexpr int kNaiveSplits = 64;   // seed: M -> 64 partial rows -> 1
// Split backward: a row-statistics kernel, then column tiles of 32 vectors by
// 8 row lanes; enough row splits that about this many blocks fill the GPU.
inline constexpr int kSplitStatsBlock = 512;
inline constexpr int kSplitBlocksPerSM = 8;
// Column sums of the gw partials (colsum.cuh): rows shorter than this use
// blocks of 8 columns by 128 row lanes, longer ones 32 by 32.
inline constexpr int kColsumNarrowBelow = 4096;

}  // namespace rmsnorm::plans
