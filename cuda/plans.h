// The launch-plan tables: which kernel configuration runs for a row of a given
// length, per GPU family, as data apart from the kernels (tuning is an edit of
// a row here). The measurements behind the rows are in docs/NOTES.md, "The
// plan tables (cuda/plans.h)"; each row below says in one line why it is there.
//
// Tables are per GPU family where a kernel's features differ by family (the
// backward's copies: the bulk copy engine from sm_90, cp.async from sm_80,
// plain loads on sm_75); the forward uses plain loads everywhere and has one
// table. The family is that of the code the GPU runs (the kernels' PTX
// version: a compute_80 build on an H200 is family 80), see dispatch.cuh.
//
// Rows are keyed by the row length in 16-byte vectors (nvec = N * sizeof(x) /
// 16: 8 elements for bf16/f16, 4 for f32; the comments give N for bf16). The
// first row whose max_nvec >= nvec is used. A row past the end of a table goes
// to that direction's fallback (looped forward, split backward; LayerNorm: the
// built-in, decided by the op), which handles any N.
#pragma once

#include <cstddef>
#include <iterator>

namespace rmsnorm::plans {

// One table row. The tables write rows with field names through RowMaker
// (upto(n).block(b)...): a field left out keeps its default here.
struct RowPlan {
  int max_nvec;  // the longest row (16-byte vectors) this row plans for
  int block;     // threads per block
  int group;     // threads that share one row: <= 32 reduces with shuffles
                 // only, block / group rows a step; == block: a row a block
  int chunks;    // 16-byte vectors a thread holds per row (registers): a row
                 // is group * chunks vectors long at most
  int stages = 1;  // backward: steps of x and g in shared memory (one being
                   // computed on, stages - 1 in flight); forward: rows in
                   // registers at once
  bool bulk = false;  // backward: a step's rows arrive through the bulk copy
                      // engine (one thread issues them), not per-thread copies
  int cluster = 1;    // sm_90 on: blocks of a thread-block cluster
                      // that split one row by columns (rows past one SM's
                      // shared memory; recorded into MLX's graph as a child
                      // graph keyed by this shape, gpu_util.cpp record); past
                      // kMaxPortableCluster the GPU must allow it (launch.cu)
  bool persistent = true;  // forward: the grid is what stays resident and
                           // walks the rows; false: a block per step of rows
  int min_steps = 1;   // LayerNorm backward: steps of rows a unit walks at
                       // least (caps the grid, so the partial rows)
  int min_blocks = 0;  // blocks a SM the kernel's registers must allow
                       // (__launch_bounds__); 0: no cap
  int family = 90;  // backward: the plan family whose table holds the row
                    // (90, or 80 for the rows of families 80 and 75); its
                    // kernel is built for that family's architectures only
                    // (common.cuh arch::builds_family): nothing else runs it
};

// Field-named rows in C++17 (the kernels build as C++17, see
// cuda/CMakeLists.txt): upto(max_nvec).block(256).group(32).chunks(2) sets
// the fields of those names and leaves the others at RowPlan's defaults.
struct RowMaker {
  RowPlan p;
  constexpr RowMaker block(int v) const { return with(&RowPlan::block, v); }
  constexpr RowMaker group(int v) const { return with(&RowPlan::group, v); }
  constexpr RowMaker chunks(int v) const { return with(&RowPlan::chunks, v); }
  constexpr RowMaker stages(int v) const { return with(&RowPlan::stages, v); }
  constexpr RowMaker bulk(bool v = true) const { return with(&RowPlan::bulk, v); }
  constexpr RowMaker cluster(int v) const { return with(&RowPlan::cluster, v); }
  constexpr RowMaker persistent(bool v) const { return with(&RowPlan::persistent, v); }
  constexpr RowMaker min_blocks(int v) const { return with(&RowPlan::min_blocks, v); }
  constexpr operator RowPlan() const { return p; }

 private:
  template <typename T>
  constexpr RowMaker with(T RowPlan::*field, T v) const {
    RowMaker r = *this;
    r.p.*field = v;
    return r;
  }
};
// A row for rows of up to max_nvec 16-byte vectors.
constexpr RowMaker upto(int max_nvec) { return RowMaker{RowPlan{max_nvec, 0, 0, 0}}; }

// Clusters of up to 8 blocks run on every GPU with clusters; 16 is a
// non-portable size (H100, H200) that the kernel opts in to (launch.cu) and a
// GPU that cannot hold it refuses: clusters_resident is 0 there, and the
// planners take the row past the table.
inline constexpr int kMaxPortableCluster = 8;
inline constexpr int kMaxCluster = 16;

// The first row of `table` whose max_nvec covers rows of nvec 16-byte
// vectors, or -1 past the table (the planners' lookup).
template <std::size_t K>
constexpr int row_for(const RowPlan (&table)[K], int nvec) {
  for (std::size_t i = 0; i < K; ++i)
    if (nvec <= table[i].max_nvec) return int(i);
  return -1;
}

// Dynamic shared memory of one persistent-backward block for rows of nvec
// 16-byte vectors of x, g being g_per_x times as wide as x (1 or 2).
inline std::size_t persistent_smem(const RowPlan& p, int nvec, int g_per_x) {
  const std::size_t slice = (nvec + p.cluster - 1) / p.cluster;
  return std::size_t(p.stages) * (p.block / p.group) * slice * 16 * (1 + g_per_x);
}

// A row of families 80 and 75: per-thread copies instead of the bulk copy
// engine (no copy engine there; on sm_75 the copies are plain loads and
// stores), built for those architectures only (RowPlan::family).
constexpr RowPlan per_thread_copies(RowPlan p) {
  p.bulk = false;
  p.family = 80;
  return p;
}

// --- RMSNorm backward, persistent kernel --------------------------------------
// x and g staged in shared memory (two stages everywhere: a third lost 1-6%),
// the gw partial in fp32 registers. w and the gw partial (2 * chunks * VEC
// floats) stay live across the row loop, so chunks stops at 4 before ptxas
// spills. Shared memory is stages * rows a step * N * (sizeof x + sizeof g):
// at N = 16384 bf16 two stages take 128 KiB, one block a SM; longer rows span
// a cluster (below), and rows past the table, or whose stages do not fit, take
// the split plan. Chosen with cuda/cli/tune_backward on the H200.
inline constexpr RowPlan kBackwardSm90[] = {
    // N <= 32: 4 lanes a row, 32 rows a step
    upto(4).block(128).group(4).chunks(1).stages(2),
    // N <= 64: 8 lanes a row, 16 rows a step
    upto(8).block(128).group(8).chunks(1).stages(2),
    // N <= 128 (QK-norm head dims): 8 rows a step; bulk won (262144x128)
    upto(16).block(128).group(16).chunks(1).stages(2).bulk(),
    // N <= 256: a warp a row
    upto(32).block(256).group(32).chunks(1).stages(2),
    // N <= 512: a warp a row, 2 vectors a lane
    upto(64).block(256).group(32).chunks(2).stages(2),
    // N <= 1024: a block a row from here on; small blocks, 10 a SM, beat a
    // warp a row at 8 rows a step; bulk won (65536x1024)
    upto(128).block(128).group(128).chunks(1).stages(2).bulk(),
    // N <= 2048: per-thread copies ahead of bulk (32768x2048)
    upto(256).block(256).group(256).chunks(1).stages(2),
    // N <= 4096: per-thread copies ahead of bulk (16384x2880, 16384x4096)
    upto(512).block(256).group(256).chunks(2).stages(2),
    // N <= 5120: sized to the row (512 x 2 left 38% of the lanes idle)
    upto(640).block(320).group(320).chunks(2).stages(2),
    // N <= 8192: the seed's shape; bulk won (16384x8192)
    upto(1024).block(512).group(512).chunks(2).stages(2).bulk(),
    // N <= 16384: 4 vectors a thread, one block a SM; bulk won (8192x16384)
    upto(2048).block(512).group(512).chunks(4).stages(2).bulk(),
    // Past one SM's shared memory a row spans a cluster: each block stages a
    // 2048-vector slice (128 KiB in bf16) and the row sums cross the cluster
    // in distributed shared memory, so x and g are read once (the split plan
    // reads them twice). Per-thread copies beat bulk ones in clusters.
    // N <= 32768: 2 blocks a row (4096x32768 235.6 us against 263.8 bulk)
    upto(4096).block(512).group(512).chunks(4).stages(2).cluster(2),
    // N <= 65536: 4 blocks a row (2048x65536 251.2 us against 286.8 bulk)
    upto(8192).block(512).group(512).chunks(4).stages(2).cluster(4),
    // N <= 131072: 16 blocks of 512 x 2 a row (non-portable), two blocks a SM
    // in 64 KiB of stages each (H100 tuner, pushed sums: 1024x131072 281.4 us
    // against 298.1 for 512 x 4 slices of 8, the largest portable cluster;
    // through MLX 289.3 against 294.8, the fused add's 297.1 against 311.5)
    upto(16384).block(512).group(512).chunks(2).stages(2).cluster(16),
    // N <= 262144: 16 blocks a row (non-portable; QuACK's size there too), x
    // and g still read once (the split plan read them twice; H200 512x262144:
    // 347 us against 367 split, LayerNorm 406 against MLX's 874). With the
    // row sums pushed to every block (no cluster barrier a step) H100
    // 512x262144 277.7 us against 351.1, level with the copy (287.6)
    upto(32768).block(512).group(512).chunks(4).stages(2).cluster(16),
};
// Families 80 and 75 (A100, A10, RTX 30xx/40xx, L4, T4): the same rows with
// per-thread copies, up to N = 16384 (no clusters before sm_90). Not tuned on
// those GPUs, measured as PTX on the H200.
// Rows whose stages exceed a GPU's shared memory (sm_75: 64 KiB a block,
// sm_86/sm_120: 99 KiB) get no resident block there, and the planner falls
// back to the split plan.
inline constexpr RowPlan kBackwardSm80[] = {
    per_thread_copies(kBackwardSm90[0]), per_thread_copies(kBackwardSm90[1]),
    per_thread_copies(kBackwardSm90[2]), per_thread_copies(kBackwardSm90[3]),
    per_thread_copies(kBackwardSm90[4]), per_thread_copies(kBackwardSm90[5]),
    per_thread_copies(kBackwardSm90[6]), per_thread_copies(kBackwardSm90[7]),
    per_thread_copies(kBackwardSm90[8]), per_thread_copies(kBackwardSm90[9]),
    per_thread_copies(kBackwardSm90[10]),
};

// --- RMSNorm forward (fwd_rows: the row in registers) -------------------------
// Chosen with cuda/cli/tune_forward on the H200 (% of a device copy of x).
inline constexpr RowPlan kForward[] = {
    // N <= 32 .. 512: a persistent grid with w in fp32 registers (short rows
    // make many steps; w is read once a block, not once a row)
    upto(4).block(128).group(4).chunks(1),    // N <= 32: 4 lanes a row
    upto(8).block(128).group(8).chunks(1),    // N <= 64: 8 lanes a row
    upto(16).block(256).group(16).chunks(1),  // N <= 128 (QK-norm): 16 rows a step
    upto(32).block(256).group(32).chunks(1),  // N <= 256: a warp a row
    upto(64).block(256).group(32).chunks(2),  // N <= 512: a warp, 2 vectors a lane
    // N <= 1024 .. 16384: a block per step, small blocks, w read after the
    // reduction (96-101% of the copy; the persistent grid 61-87%, w in
    // registers caps residency)
    upto(128).block(64).group(64).chunks(2).persistent(false),     // N <= 1024
    upto(256).block(128).group(128).chunks(2).persistent(false),   // N <= 2048
    // N <= 2560: sized to the row (faster than the N <= 4096 row there)
    upto(320).block(160).group(160).chunks(2).persistent(false),
    upto(512).block(128).group(128).chunks(4).persistent(false),   // N <= 4096
    // N <= 5120: sized to the row, 56 registers (the built-in's 128 x 5: 70)
    upto(640).block(160).group(160).chunks(4).persistent(false),
    upto(1024).block(256).group(256).chunks(4).persistent(false),  // N <= 8192
    upto(2048).block(512).group(512).chunks(4).persistent(false),  // N <= 16384
    // N <= 32768: 1024 threads get 64 registers each: x fits, w or 8 chunks
    // would not (spills); longer rows take the looped kernel
    upto(4096).block(1024).group(1024).chunks(4).persistent(false),
    // Longer rows span a thread-block cluster (sm_90 on; elsewhere the looped
    // kernel): each block holds a slice in registers, the sums of squares
    // cross the cluster, and the row is read once (the looped kernel reads
    // it twice). 512 x 8 slices of 2 and 4 blocks capped at 64 registers, two
    // blocks a SM: twice the bytes in flight of the 512 x 4 slices of 4 and 8
    // (one block a SM at 55 registers) and half the blocks that wait on the
    // cluster's sums (H100: 2048x65536 94.4% of a copy against 77.5%,
    // 1024x131072 89.9% against 72.8%; 256 x 8 slices of 8 90.1%)
    upto(8192).block(512).group(512).chunks(8).persistent(false).cluster(2).min_blocks(2),
    upto(16384).block(512).group(512).chunks(8).persistent(false).cluster(4).min_blocks(2),
    // N <= 262144: the same slices, 8 blocks (H200 512x262144: 183 us, 69% of
    // the copy, against 208 looped; LayerNorm 189 against MLX's 401)
    upto(32768).block(512).group(512).chunks(8).persistent(false).cluster(8).min_blocks(2),
};

// The fused add's forward past N = 16384 (kForwardAddLongPast vectors) on
// sm_90: x and the residual, two held rows, do not fit kForward's 512 x 8
// slices (128 registers and spills), so its rows are 512 x 4 slices of 2, 4,
// 8 and 16 blocks, capped at two blocks a SM as kForward's are (AddRmsRow:
// 63-64 registers, no spills; AddLayerRow: 62-64, see add_long_kernel).
// AddLayerRow ran them uncapped before (79-96 registers, one block a SM):
// capped, H100 4096x24576 301.6 us against 371.3 (90% of a copy of the same
// bytes against 74%), 512x262144 458.4 against 617.6; and ahead of an add
// then LayerNorm's own row of h (356.4, 496.5; cuda/cli/tune_add_forward).
// Elsewhere it keeps kForward's rows.
inline constexpr int kForwardAddLongPast = 2048;
inline constexpr RowPlan kForwardAddLong[] = {
    upto(4096).block(512).group(512).chunks(4).persistent(false).cluster(2).min_blocks(2),
    upto(8192).block(512).group(512).chunks(4).persistent(false).cluster(4).min_blocks(2),
    upto(16384).block(512).group(512).chunks(4).persistent(false).cluster(8).min_blocks(2),
    // N <= 262144: 16 blocks
    upto(32768).block(512).group(512).chunks(4).persistent(false).cluster(16).min_blocks(2),
};
// The fused add's row of kForwardAddLong for rows of nvec vectors, or -1
// where nvec is not past kForwardAddLongPast or is past the table. Both
// norms run every row: add_rms_norm's looped kernel, ahead of the row of 16
// blocks before the pushed sums (H200 512x262144: 346 us against 372), fell
// behind it after them (H100: 477.1 against 385.4; docs/NOTES.md).
constexpr int add_long_row(int nvec) {
  return nvec > kForwardAddLongPast ? row_for(kForwardAddLong, nvec) : -1;
}

// Forward, one wave of rows (decode: a token's 1-64 rows, at most one step of
// rows a SM): one row's latency, not bandwidth, counts. w is loaded beside x
// (fwd_rows PERSISTENT), never after the reduction (a second round trip).
// Chosen with cuda/cli/tune_decode (200 launches in a CUDA graph). Past this
// table, one wave takes kForward's row with w first (forward.cu).
inline constexpr RowPlan kForwardOneWave[] = {
    // N <= 512: kForward's rows (lanes of a warp a row, w in registers already)
    kForward[0], kForward[1], kForward[2], kForward[3], kForward[4],
    // N <= 1024 .. 5120: a block a row, one vector a thread (fastest at 1,
    // 16 and 64 rows against 2 or 4 vectors a thread; us a launch at 1 row
    // below); at N = 8192 kForward's 256 x 4 with w first stays level with
    // 512 x 2 and ahead of 1024 x 1
    upto(128).block(128).group(128).chunks(1),  // N <= 1024: 1.56 us against 1.77 (64 x 2)
    upto(256).block(256).group(256).chunks(1),  // N <= 2048: 1.80 against 1.98 (128 x 2)
    upto(320).block(320).group(320).chunks(1),  // N <= 2560: 1.85 against 2.03 (160 x 2)
    upto(512).block(512).group(512).chunks(1),  // N <= 4096: 2.00 against 2.11 (256 x 2)
    upto(640).block(640).group(640).chunks(1),  // N <= 5120: 2.12 against 2.20 (320 x 2)
};

// --- LayerNorm (row_math.cuh LayerRow; planned in layer_norm.cu) --------------
// RMSNorm's former N <= 131072 row, 512 x 4 slices of 8 blocks, which the
// LayerNorm tables keep (not measured on RMSNorm's slices of 16).
inline constexpr RowPlan kLayerBackwardSlices8 =
    upto(16384).block(512).group(512).chunks(4).stages(2).cluster(8);
// LayerNorm's earlier N <= 8192 backward row, which add_layer_norm's
// backward and families 80 and 75 keep: the row that replaced it in
// kLayerBackwardSm90 was measured for LayerNorm alone, bf16, on sm_90 (and
// its two rows a step take 160 KiB, more than sm_86 or sm_120 give a block).
inline constexpr RowPlan kLayerBackward8192Block256 =
    upto(1024).block(256).group(256).chunks(4).stages(2).bulk();
// LayerNorm's earlier N <= 4096 backward row (256 x 2, bulk, three stages),
// which add_layer_norm's backward keeps for the same reason (g_h staged beside
// x and g: the row that replaced it was measured for LayerNorm alone).
inline constexpr RowPlan kLayerBackward4096Stages3 =
    upto(512).block(256).group(256).chunks(2).stages(3).bulk();
// The same walks with LayerNorm rows of their own. Chosen with
// cuda/cli/layer_norm_bench (the chain as planned: walk + one column sum of gw
// and gb, CUDA graphs of 20 calls).
// Backward: one block reduction a row (four sums about a shift), the fp32
// weight in shared memory, so registers hold the gw and gb partials. Every
// unit writes 2 N fp32 of partials that the column sum reads back, so at mid N
// the rows take several rows a step (the block adds its rows' partials first).
inline constexpr RowPlan kLayerBackwardSm90[] = {
    // N <= 512: RMSNorm's rows
    kBackwardSm90[0], kBackwardSm90[1], kBackwardSm90[2], kBackwardSm90[3], kBackwardSm90[4],
    // N <= 1024: a warp a row, 4 rows a step (528 units against 1320 for 128 x 1)
    upto(128).block(128).group(32).chunks(4).stages(2).bulk(),
    // N <= 1536: 3 rows a step of 64 x 3 (ahead of the N <= 2048 row at 1280)
    upto(192).block(192).group(64).chunks(3).stages(2).bulk(),
    // N <= 2048: 2 rows a step of 128 x 2 (ahead of a block a row)
    upto(256).block(256).group(128).chunks(2).stages(2).bulk(),
    // N <= 3072: 128 x 3, bulk (ahead of 192 x 2 per-thread copies)
    upto(384).block(128).group(128).chunks(3).stages(2).bulk(),
    // N <= 4096: 320 x 2, per-thread copies (H100, layer_norm_bench, 8192x4096
    // 76.1 us against 87.7 for kLayerBackward4096Stages3; through MLX with
    // each call taking the previous gx, as in a model, 8192x4096 94.9-96.4
    // against 106.0-112.5 and 16384x4096 162.0-163.9 against 180.8-185.8;
    // with the calls side by side level, docs/NOTES.md)
    upto(512).block(320).group(320).chunks(2).stages(2),
    // N <= 5120: 160 x 4, bulk (ahead of RMSNorm's 320 x 2)
    upto(640).block(160).group(160).chunks(4).stages(2).bulk(),
    // N <= 8192: 2 rows a step of 256 x 4, bulk, one block a SM (H100,
    // layer_norm_bench: 4096x8192 80.0 us, 16384x8192 284.9, against 86.2 and
    // 296.1 for kLayerBackward8192Block256; 512 x 2 of three stages 77.5 and
    // 298.6; our RMSNorm 81.6 and 288.6. Through MLX, bench-ln: 2-6% ahead at
    // 4096x8192 .. 32768x8192)
    upto(1024).block(512).group(256).chunks(4).stages(2).bulk(),
    // N <= 16384: RMSNorm's 512 x 4 (ahead of 1024 x 2)
    kBackwardSm90[10],
    // Past one SM a row spans a cluster (the shift crosses it as the row's
    // first vector, persistent_walk). 512 x 4 slices take 128 registers and,
    // with their stages and fp32 weight, 192 KiB in bf16: one block (16
    // warps) a SM. Slices of 256 x 4 take half the shared memory, two blocks
    // a SM (H100, cuda/cli/layer_norm_bench, bf16, us against 512 x 4):
    // N <= 32768: 4 blocks (4096x24576 241.0 against 248.1; 4096x32768 309.4
    // against 318.6; 256 x 2 slices of 8: 347.2)
    upto(4096).block(256).group(256).chunks(4).stages(2).cluster(4),
    // N <= 65536: 8 blocks (2048x65536 321.7 against 346.4)
    upto(8192).block(256).group(256).chunks(4).stages(2).cluster(8),
    // N <= 131072, 262144: 512 x 4 slices of 8 and RMSNorm's of 16 blocks
    // (1024x131072: 256 x 4 slices of 16 level, 377.5 against 376.7)
    kLayerBackwardSlices8, kBackwardSm90[14],
};
// Families 80 and 75: the same rows with per-thread copies (not measured),
// without the cluster rows.
inline constexpr RowPlan kLayerBackwardSm80[] = {
    per_thread_copies(kLayerBackwardSm90[0]),  per_thread_copies(kLayerBackwardSm90[1]),
    per_thread_copies(kLayerBackwardSm90[2]),  per_thread_copies(kLayerBackwardSm90[3]),
    per_thread_copies(kLayerBackwardSm90[4]),  per_thread_copies(kLayerBackwardSm90[5]),
    per_thread_copies(kLayerBackwardSm90[6]),  per_thread_copies(kLayerBackwardSm90[7]),
    per_thread_copies(kLayerBackwardSm90[8]),  per_thread_copies(kLayerBackwardSm90[9]),
    per_thread_copies(kLayerBackwardSm90[10]), per_thread_copies(kLayerBackward8192Block256),
    per_thread_copies(kLayerBackwardSm90[12]),
};
// add_layer_norm's backward (AddLayerRow) stages g_h beside x and g: below
// one SM's row the same rows; past it slices of its own, whose three operands
// leave room for two blocks a SM or more (H100, layer_norm_bench, bf16, us;
// before: 512 x 4 slices where the weight fit, else kLayerBackwardWRegsSm90):
// past the table the weight-in-registers rows take it (N > 65536).
inline constexpr RowPlan kAddLayerBackwardSm90[] = {
    kLayerBackwardSm90[0],  kLayerBackwardSm90[1],  kLayerBackwardSm90[2],
    kLayerBackwardSm90[3],  kLayerBackwardSm90[4],  kLayerBackwardSm90[5],
    kLayerBackwardSm90[6],  kLayerBackwardSm90[7],  kLayerBackwardSm90[8],
    kLayerBackward4096Stages3, kLayerBackwardSm90[10], kLayerBackward8192Block256,
    kLayerBackwardSm90[12],
    // N <= 24576: LayerNorm's 256 x 4 slices of 4 (4096x24576 288.8 against 292.2)
    upto(3072).block(256).group(256).chunks(4).stages(2).cluster(4),
    // N <= 32768: 256 x 2 slices of 8 (4096x32768 385.9; 256 x 4 slices of 4
    // 414.8, one block a SM; 512 x 2 slices of 4, weight in registers, 440.4)
    upto(4096).block(256).group(256).chunks(2).stages(2).cluster(8),
    // N <= 65536: 256 x 2 slices of 16 (2048x65536 440.5; 256 x 4 slices of
    // 8 449.9; 512 x 2 slices of 8, weight in registers, 472.1)
    upto(8192).block(256).group(256).chunks(2).stages(2).cluster(16),
};
// Where the stages and the fp32 weight do not fit a block (16-bit x with fp32
// g past N = 8192), the weight stays in registers (WeightInRegisters<Row>).
inline constexpr RowPlan kLayerBackwardWRegsSm90[] = {
    // N <= 16384: 512 x 4, 128 registers (H200, bf16 g, 8192x16384: 220.7
    // us, level with the shared weight's 220.1; 1024 x 2 at 64 registers
    // spilled 300-500 bytes a thread and took 266.1)
    upto(2048).block(512).group(512).chunks(4).stages(2).bulk(),
    // N <= 32768, 65536 where the rows above do not fit (since the 256-thread
    // slices: a GPU that refuses the fused add's clusters of 16): 512 x 2
    // slices of 4 and 8 blocks, half the stages of the 512 x 4 rows (not tuned)
    upto(4096).block(512).group(512).chunks(2).stages(2).cluster(4),
    upto(8192).block(512).group(512).chunks(2).stages(2).cluster(8),
    // N <= 131072, 262144: 512 x 4 slices of 8 and 16 (bf16 g only: fp32
    // g's stages do not fit)
    kLayerBackwardSlices8, kBackwardSm90[14],
};
inline constexpr RowPlan kLayerBackwardWRegsSm80[] = {
    per_thread_copies(kLayerBackwardWRegsSm90[0]),
};
// Forward: LayerRow on RMSNorm's rows, w and b read in x's dtype where both
// are given in it (fwd_rows W_AS_X). Register caps elsewhere spilled and lost.
// add_layer_norm (AddLayerRow) runs these rows, its forward uncapped
// (forward.cuh planned_fwd_kernel says why).
inline constexpr RowPlan kLayerForward[] = {
    // N <= 512: RMSNorm's rows
    kForward[0], kForward[1], kForward[2], kForward[3], kForward[4],
    // N <= 768: a warp a row (ahead of 64 x 2)
    upto(96).block(128).group(32).chunks(4).persistent(false),
    // N <= 1024 .. 8192: RMSNorm's rows (N = 2560 and 5120 not measured)
    kForward[5], kForward[6], kForward[7], kForward[8], kForward[9], kForward[10],
    // N <= 16384: 512 x 4 capped at 64 registers, 2 blocks a SM (ahead of uncapped)
    upto(2048).block(512).group(512).chunks(4).persistent(false).min_blocks(2),
    // N <= 32768: RMSNorm's row (not measured); past it RMSNorm's cluster
    // rows (sm_90 on; capped: 63 registers with w and b read as x; with the
    // general read, 36 bytes of spills in bf16, 52 in fp16). The fused add's
    // rows past N = 16384 are kForwardAddLong on sm_90.
    kForward[12], kForward[13], kForward[14], kForward[15],
};

// The fused residual add (add_rms_norm, add_layer_norm) runs the rows above
// up to one SM's row, forward and backward: h takes x's place in registers or
// in the stages, so a row's bounds hold unchanged, and its extra operands add
// bytes per row in the same proportion at every N. In the backward gh takes
// one more x-sized slot a stage (persistent_smem's g_per_x + 1): where that no
// longer fits a block (N = 16384 with fp32 g) the split plan takes the row.
// Past one SM's row it has rows of its own (kForwardAddLong,
// kAddLayerBackwardSm90). Below it not re-tuned (docs/fused-add.md).

// --- Fallbacks (any N, any alignment; VEC = 1 when N or a pointer is not
// 16-byte friendly) -------------------------------------------------------------
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
// From here the final sums take blocks of 128 columns by 8 row lanes: the
// cluster rows leave few partial rows (7-66 clusters) over many columns, and
// 32 x 32 blocks, each thread one or two loads, took 4 waves of blocks at N =
// 32768 and 31 at 262144 (H100, ncu through MLX: 12.6 us at 4096x32768 for
// 8.6 MB of partials, 17.2 at 2048x65536).
inline constexpr int kColsumWideFrom = 32768;
// From here 512 columns by 2 lanes: clusters of 8 and 16 blocks leave 15 and
// 7 partial rows, and 128-column blocks took 8 waves of a load a thread at N =
// 262144 (H100, ncu through MLX: 15.7 us for RMSNorm's 7.3 MB of partials).
inline constexpr int kColsumWidestFrom = 131072;
// Columns a block of the column sum over rows of n; FINAL: the sum of the
// partial rows (the naive chain's first sum over M rows stays 8 or 32).
constexpr int colsum_cols(int n, bool final_sum) {
  if (n < kColsumNarrowBelow) return 8;
  if (!final_sum || n < kColsumWideFrom) return 32;
  return n < kColsumWidestFrom ? 128 : 512;
}

// --- What the planners rely on --------------------------------------------------
template <typename T, std::size_t K>
constexpr bool ascending(const T (&table)[K]) {
  for (std::size_t i = 1; i < K; ++i)
    if (table[i].max_nvec <= table[i - 1].max_nvec) return false;
  return true;
}
// Every row says its shape (block, group, chunks; a row a group), and
// block / group rows fit a block.
template <typename T, std::size_t K>
constexpr bool complete(const T (&table)[K]) {
  for (std::size_t i = 0; i < K; ++i)
    if (table[i].block <= 0 || table[i].group <= 0 || table[i].chunks <= 0 ||
        table[i].block % table[i].group != 0)
      return false;
  return true;
}
// No row of the table sets `field` off `none` (a bool field: off false).
template <typename T, std::size_t K, typename F>
constexpr bool without(const T (&table)[K], F T::*field, F none = F{}) {
  for (std::size_t i = 0; i < K; ++i)
    if (table[i].*field != none) return false;
  return true;
}
static_assert(ascending(kBackwardSm90) && ascending(kBackwardSm80) && ascending(kForward) &&
              ascending(kForwardOneWave) && ascending(kLayerBackwardSm90) &&
              ascending(kAddLayerBackwardSm90) && ascending(kLayerBackwardSm80) &&
              ascending(kLayerForward));
static_assert(complete(kBackwardSm90) && complete(kBackwardSm80) && complete(kForward) &&
              complete(kForwardOneWave) && complete(kLayerBackwardSm90) &&
              complete(kAddLayerBackwardSm90) && complete(kLayerBackwardSm80) &&
              complete(kLayerBackwardWRegsSm90) &&
              complete(kLayerBackwardWRegsSm80) && complete(kLayerForward));
// A cluster splits one row a step into slices of whole vectors.
constexpr bool splits_one_row(const RowPlan& p) {
  return p.cluster == 1 ||
         (p.block == p.group && p.cluster <= kMaxCluster && p.max_nvec % p.cluster == 0 &&
          p.max_nvec / p.cluster <= p.group * p.chunks);
}
template <std::size_t K>
constexpr bool clusters_split_rows(const RowPlan (&table)[K]) {
  for (std::size_t i = 0; i < K; ++i)
    if (!splits_one_row(table[i])) return false;
  return true;
}
static_assert(clusters_split_rows(kBackwardSm90) && clusters_split_rows(kForward) &&
                  clusters_split_rows(kLayerBackwardSm90) &&
                  clusters_split_rows(kAddLayerBackwardSm90) &&
                  clusters_split_rows(kLayerBackwardWRegsSm90) &&
                  clusters_split_rows(kLayerForward) && clusters_split_rows(kForwardAddLong),
              "a cluster row: a row a step, at most kMaxCluster blocks, each slice in one block");
static_assert(without(kBackwardSm80, &RowPlan::cluster, 1) &&
                  without(kLayerBackwardSm80, &RowPlan::cluster, 1) &&
                  without(kLayerBackwardWRegsSm80, &RowPlan::cluster, 1) &&
                  without(kForwardOneWave, &RowPlan::cluster, 1),
              "clusters: the sm_90 backward tables, and the forward's, which the planners "
              "skip before sm_90");
// Each backward table's kernels are built for its own family's architectures
// (RowPlan::family): the rows of families 80 and 75 are per_thread_copies rows
// (no bulk copies before sm_90), the sm_90 tables' rows are family 90's.
static_assert(without(kBackwardSm80, &RowPlan::family, 80) &&
                  without(kLayerBackwardSm80, &RowPlan::family, 80) &&
                  without(kLayerBackwardWRegsSm80, &RowPlan::family, 80) &&
                  without(kBackwardSm80, &RowPlan::bulk) &&
                  without(kLayerBackwardSm80, &RowPlan::bulk) &&
                  without(kLayerBackwardWRegsSm80, &RowPlan::bulk),
              "families 80 and 75: per_thread_copies rows");
static_assert(without(kBackwardSm90, &RowPlan::family, 90) &&
                  without(kLayerBackwardSm90, &RowPlan::family, 90) &&
                  without(kAddLayerBackwardSm90, &RowPlan::family, 90) &&
                  without(kLayerBackwardWRegsSm90, &RowPlan::family, 90),
              "the sm_90 backward tables: family 90's rows");
// The fused add's rows take over where kForward's row past
// kForwardAddLongPast begins, and end where the forward tables end.
template <std::size_t K>
constexpr bool add_long_covers(const RowPlan (&table)[K]) {
  int past = -1;  // the first row past kForwardAddLongPast
  for (std::size_t i = 0; i < K && past < 0; ++i)
    if (table[i].max_nvec > kForwardAddLongPast) past = int(i);
  return past > 0 && table[past - 1].max_nvec == kForwardAddLongPast &&
         table[K - 1].max_nvec == kForwardAddLong[std::size(kForwardAddLong) - 1].max_nvec;
}
static_assert(ascending(kForwardAddLong) && complete(kForwardAddLong) &&
              add_long_covers(kForward) && add_long_covers(kLayerForward));
// One wave loads w beside x (fwd_rows PERSISTENT), a row a step, uncapped.
static_assert(without(kForwardOneWave, &RowPlan::persistent, true) &&
                  without(kForwardOneWave, &RowPlan::stages, 1) &&
                  without(kForwardOneWave, &RowPlan::min_blocks),
              "the one-wave rows are persistent, of one stage, uncapped");
static_assert(without(kBackwardSm80, &RowPlan::bulk) &&
                  without(kLayerBackwardSm80, &RowPlan::bulk) &&
                  without(kLayerBackwardWRegsSm80, &RowPlan::bulk),
              "families 80 and 75 have no bulk copy engine");

}  // namespace rmsnorm::plans
