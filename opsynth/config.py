"""Every constant of the pipeline in one place: workloads, the released set's mixture, thresholds, versions.

Commands and stages read these; nothing else in the project hard-codes a size, share or tolerance.
"""

from __future__ import annotations

from opsynth.data_sources import TRANSFORMERS, torch_source
from opsynth.device_speed import DeviceSpeed
from opsynth.workload import Workload

VERSION = "0.1.0"

# The released CUDA-Agent-Ops-6K mixture (paper Table 3, confirmed on the data), in percent.
OPS6K_MIXTURE: dict[str, float] = {
    torch_source(1): 3.40,
    torch_source(2): 83.77,
    torch_source(3): 7.62,
    torch_source(4): 2.80,
    torch_source(5): 1.23,
    TRANSFORMERS: 1.18,
}
DATA_SOURCES = tuple(OPS6K_MIXTURE)
MIXTURE_ALIASES = {f"torch{k}": torch_source(k) for k in range(1, 6)} | {TRANSFORMERS: TRANSFORMERS}

PRESETS: dict[str, dict] = {
    "ops6k": {"num_samples": 6000, "mixture": OPS6K_MIXTURE, "op_weights": "ops6k"},
    "ops60k": {"num_samples": 60000, "mixture": OPS6K_MIXTURE, "op_weights": "ops6k"},
    "ops600k": {"num_samples": 600000, "mixture": OPS6K_MIXTURE, "op_weights": "ops6k"},
}
DEFAULT_PRESET = "ops6k"

WORKLOADS: dict[str, Workload] = {
    # Small shapes and a CPU-sized window: the whole pipeline runs on a laptop or in CI in seconds.
    "tiny": Workload(
        name="tiny",
        batch_sizes=(2, 4, 8),
        channels=(4, 8, 16),
        features=(16, 32, 64),
        spatial={3: (16, 32, 64), 4: (8, 16, 24), 5: (4, 6, 8)},
        max_elements=1 << 18,
        runtime_window_ms=(0.005, 50.0),
        timeout_s=60.0,
    ),
    # The paper's scale: large batches and extents (the released set's median input holds 3.1e7 fp32
    # elements); the 1-100 ms window is measured on the GPU that generates the data.
    "gpu": Workload(
        name="gpu",
        batch_sizes=(64, 128, 256, 512),
        channels=(16, 32, 64, 128),
        features=(512, 1024, 2048, 4096),
        spatial={3: (512, 1024, 2048), 4: (64, 128, 256), 5: (16, 32, 48)},
        max_elements=1 << 29,
        runtime_window_ms=(1.0, 100.0),
        timeout_s=120.0,
        min_largest_dim=512,  # the released set: 99.4 % of tasks have an input dimension of at least 512
    ),
}

# The agent's verification tolerance (torch.testing.assert_close) and its number of input draws.
VERIFY_ATOL = 1e-2
VERIFY_RTOL = 1e-2
NUM_DRAWS = 5
# Two input draws tell a task's outputs apart where this share of their elements differ beyond the tolerance (at
# least one element): a task whose output is one value but for a draw's few extreme inputs (a tanh saturated by
# the log_softmax before it) would otherwise pass with one seed and fail with another. `validate` judges by it.
DISTINGUISHING_FRACTION = 1e-3

# generate keeps a task only where its checks pass with room to spare, as its timing must lie KEEP_MARGIN inside
# the window: its row is checked again with other input draws and a fresh compile (`validate`'s, the agent's
# checker's), by the thresholds themselves. Its draws' outputs must differ in KEEP_DISTINGUISHING_FRACTION of their
# elements, beyond KEEP_TOLERANCE_MARGIN times the tolerance, and every pair of them where the outputs are small (the
# checker compares each draw with the first); its rerun and compiled outputs must agree with the first draw's within
# the tolerance over KEEP_TOLERANCE_MARGIN. The verdicts that turn on the draws are those of small outputs: of 1,160
# tiny tasks kept by generate's draws, each checked again with 7 other seeds' draws, the 18 that failed any had at
# most 64 output elements (1 or 2: 11 of 28), failing 0.48 % of the checks; with every pair and twice the tolerance,
# 5 tasks and 0.13 %, 26 more rejected. On one H200 a 600-row run with all of them made 750-758 executions (seven
# runs; 729-738 with the fraction and the compiled agreement's half tolerance alone), and its rows checked again
# whole kept 597 and 599 of 600 (before them: 596 and 596).
KEEP_DISTINGUISHING_FRACTION = 1e-2
KEEP_TOLERANCE_MARGIN = 2.0
# A discrete output (bool or integer: a comparison, an argmax) has no tolerance to keep a margin in: a value that
# compiled arithmetic puts on the other side of a threshold flips an element. generate compares the compiled model
# with eager on every draw of the checks where an output is discrete. One H200: a layer norm compared with a
# parameter (458 million bool elements) agreed on the draw generate checked and differed in 1 to 3 elements on each
# of four others; a flip that frequent passes two draws more about one time in 30 (e^-3.5; 1af1b31 compared three
# draws), four about one time in 1,100.
KEEP_COMPILE_DRAWS = NUM_DRAWS

# CUDA: each Triton configuration inductor autotunes is benchmarked for at most this long and this many runs,
# after this many L2 flushes, its time estimated from this many runs first (inductor's defaults: 25 ms or 100
# runs after 100 flushes, from 5); see opsynth.filters.autotuning.
AUTOTUNE_BENCHMARK_MS = 1
AUTOTUNE_BENCHMARK_RUNS = 10
AUTOTUNE_CACHE_FLUSHES = 10
AUTOTUNE_ESTIMATION_RUNS = 2

# Each execution worker compiles a task's Triton kernels in this many processes of its own (inductor's pool,
# forked from the worker once it is up; 1: in the worker itself). On one H100 (16 cores, 14 workers), run next to
# the in-process compile on one machine: the workers' compiles 11-16 % shorter and the GPU 2-7 points busier where
# compiling bound the run; 2 and 8, run between runs of 4, did no better.
COMPILE_PROCESSES = 4

# generate keeps a task only where its eager time is this far inside the runtime window (at least low * (1 +
# KEEP_MARGIN), at most high / (1 + KEEP_MARGIN)): re-measured alone on one H200, one row in 20 of a 6K run ran
# 9.4 % faster than recorded or more (the 5th percentile of now / recorded: 0.906; the 2nd: 0.863), and 9 of 800
# rows recorded at 1.00-1.11 ms fell under a 1 ms window; with a 10 % margin, 2 to 7 of 600 rows of three 600-row
# runs still did (re-measured at 0.996-0.999 ms). `validate` judges by the window itself.
KEEP_MARGIN = 0.15
# All that generate asks of a task beyond validate (execution_config's keywords; stats.json's config records them).
KEEP_CHECKS = {
    "keep_margin": KEEP_MARGIN,
    "distinguishing_fraction": KEEP_DISTINGUISHING_FRACTION,
    "tolerance_margin": KEEP_TOLERANCE_MARGIN,
    "every_pair": True,
    "compile_draws": KEEP_COMPILE_DRAWS,
}

# Shape calibration: re-measures of a candidate outside the runtime window, with its batch rescaled toward
# a point CALIBRATION_TARGET of the way into the window in log terms (1-100 ms: 2.0 ms), at most
# CALIBRATION_MAX_FACTOR per step. Near the low end, not the middle: where the released set's tasks run (median
# 1.5 ms on an H200), twice the low edge so that timing noise keeps a task inside, and a fifth of the device
# time and memory a task sized for the middle (10 ms) would take: the device time of a run is its forwards'.
CALIBRATION_TRIES = 3
CALIBRATION_MAX_FACTOR = 64.0
CALIBRATION_TARGET = 0.15
# CUDA: a candidate's first try stops once its first timed forward is over FIRST_TRY_CEILING times the calibration's
# aim (8 ms in 1-100 ms), and runs again shrunk (filters.calibration). In the 6,000-row run on one H200 the kept
# rows over 8 ms were 9 % of them and 46 % of their summed eager time, most 30-40 times their prediction.
FIRST_TRY_CEILING = 4.0

# Sizing before execution (CUDA): a candidate's forward cost, counted on meta, at the GPU's speed predicts its
# time; one predicted more than SIZE_SLACK[0] times below the calibration aim, or SIZE_SLACK[1] times above it, is
# rescaled toward it, at most SIZE_MAX_FACTOR (a 64 x 2048 elementwise input needs about 8,000x to reach the aim
# on one H200) and within the element budget. Tighter below: a task measured under the window is an execution
# lost, one over the aim a little more device time (the 6,000-row run on one H200, slack 1.5 either way: 65 % of
# the candidates predicted at 1.1-1.5 ms kept, 97 % at 1.5-3 ms). The speed is one H200's, as measured by the
# profiler on its rows (memory at about 3 TB/s, fp32 arithmetic at about 40 TFLOP/s, a few microseconds a
# kernel); each round after the first corrects it by the median of measured / predicted time over the earlier
# rounds' executions.
SIZE_SLACK = (1.15, 1.5)
# A candidate made again at a scale takes the share of the element budget (its own, then wider) at which its input
# moves nearest that scale; one within this factor of it is taken without trying the wider shares.
RESCALE_TOLERANCE = 1.1
SIZE_MAX_FACTOR = 65536.0
# A candidate the sizing leaves predicted more than this many times the window's top (its sizes could not be made
# smaller) is rejected unrun, as above the window: run, its first forward and first draw alone took seconds of
# the GPU, while the timings of other tasks waited for them (two such in a 600-row run on one H200: 1.6 s a
# forward, predicted 1.8 s). Measured over predicted time lay under 0.14 for 1 % of that run's executions.
PREDICTED_ABOVE_FACTOR = 10.0
GPU_SPEED = DeviceSpeed(bytes_per_s=3.0e12, flops_per_s=4.0e13, kernel_ms=0.004)
SPEED_SAMPLES = 50  # executions it takes to correct the speed
SPEED_WINDOW = 10_000  # the latest executions whose median corrects it (a run's state stays flat)

# Timing: (warm-ups, timed iterations). On the GPU, the paper's 10 profiled iterations; the warm-ups are the
# checks' own forwards there (at least 5 before the profiler), so the first number is used on the CPU only, whose
# compiled model's timing takes 2 warm-ups and 5 timed forwards.
TIMING = {"cuda": (5, 10), "cpu": (2, 5)}

# MinHash over token 3-grams (opsynth.filters.minhash) of the normalized Model class, in decontamination.
MINHASH_PERMUTATIONS = 128
MINHASH_SHINGLE = 3
MINHASH_SEED = 1  # decontamination's (the embedded index was built with it)
AST_SIMILARITY_THRESHOLD = 0.9  # the paper: drop a task whose AST similarity to a KernelBench task exceeds this
# A task whose Model class has this estimated Jaccard with a KernelBench Model class is a near-duplicate.
KERNELBENCH_JACCARD_THRESHOLD = 0.85
# A task of two operators or more whose operator graph has this weighted Jaccard (of its Weisfeiler-Lehman
# features, opsynth.filters.compute_graph) with a KernelBench task's computes what that task does.
GRAPH_SIMILARITY_THRESHOLD = 0.9

# Within-set dedup (opsynth.filters.dedup): one row per task, and repeats of one operator graph.
MAX_ROWS_PER_OP_GRAPH = 1  # rows that may share one ordered operator list (raised where a quota needs more)
GRAPH_CAP_SLACK = 3  # where raised: this many times the rows per list an even spread would give
# A round's candidates of a data source are needed, in index order, until as many are accepted as it misses
# rows, plus NEEDED_SPARE more for what the selection may still skip as duplicates; the execution stage runs none
# after that point and the selection ignores any it ran. The dedup stage already drops repeats of a task and
# candidates past their operator graph's room (a 600-row run on one H200 had the selection skip 12 of 656 accepted
# when the dedup stage dropped exact repeats only), so each accepted candidate past the quota is an execution
# wasted, and the spare is small.
NEEDED_SPARE = 2

# Composition.
MAX_OPS = 5
COMPOSE_ATTEMPTS = 64  # tries at one candidate's chain before it is dropped as a shape_error

# Rounds. The first round of a data source is a pilot: missing rows x INITIAL_OVERSAMPLING, at most
# PILOT_CANDIDATES, which measures its yield; later rounds make missing / yield x ROUND_PADDING. The pilot is
# small because the GPU waits for its CPU stages (the next round's run beside its execution), and about 80 % of
# the candidates one H200 executes are kept (99 % on the CPU's tiny workload). No round makes
# more than MAX_ROUND_CANDIDATES (the round's records are what a runner holds in memory), and a run gives up
# after MAX_IDLE_ROUNDS rounds in a row that add no row.
INITIAL_OVERSAMPLING = 1.6
PILOT_CANDIDATES = 160
ROUND_PADDING = 1.15
# The next round, planned before this one executes, counts on this round yielding its expected rows less this
# many standard deviations of a binomial draw at that yield: a data source of a few rows falls short about half
# the time at the expectation itself, and then needs one more round (on one H200 a 600-row run's last round of 9
# candidates took 4.4 s with the GPU mostly idle). Its extra candidates cost CPU time only: the execution runs a
# round's candidates of a source only until that source's rows are in.
AHEAD_SHORTFALL_SD = 2.0
# That yield can overstate the next round's. Before a data source has finished a round it is the pilot's prior
# (1 / INITIAL_OVERSAMPLING): single operators yielded about 0.4 on one H200, and every 600-row run there ended on a
# round of 4-5 torch#1 candidates (2.5-3 s, the GPU mostly idle). After, it is the last finished round's, two rounds
# before the one planned: a source whose distinct programs run out yields less each round (single operators in a
# 2,000-row run on one H200: 0.37, 0.27, 0.20, 0.15 rows per candidate), and two rounds of a few torch#1 candidates
# followed (39 s, the GPU mostly idle). So a plan that expects a source to fall short also covers half its yield,
# with at most this many candidates more per source (a few hundred ms of CPU stages).
AHEAD_EXTRA = 32
MAX_ROUND_CANDIDATES = 4096
# Where the pipelines run in the driver's process, a round's candidates go to the worker pool as one batch (more
# than a round holds), so the workers never idle at a batch's end waiting for its last task.
IN_PROCESS_BATCH = 2 * MAX_ROUND_CANDIDATES
BATCH_PER_WORKER = 64  # elsewhere: a batch per Beam worker, for each of its execution workers
MAX_IDLE_ROUNDS = 4
# The order a batch's candidates run in: each data source's spread over this share of the batch from its start,
# the heavier first (more operators to compile; a transformers module's checks take seconds), so that a round
# ends on its lightest tasks rather than waiting for its heaviest. On one H200 a 600-row run's first round
# ended with 28 s at 30-60 % GPU busy, its transformers tasks spread to the last.
EXECUTION_SPREAD = {
    torch_source(1): 1.0,
    torch_source(2): 1.0,
    torch_source(3): 0.7,
    torch_source(4): 0.5,
    torch_source(5): 0.4,
    TRANSFORMERS: 0.2,
}
# `generate --plan` (pipeline/plan.py): a data source needs its rows / PLAN_EXECUTION_YIELD distinct tasks
# from the CPU stages (on one H200 about 80 % of the candidates executed are kept), and its walk stops after
# PLAN_SAMPLE candidates short of that, estimating what it holds from how its distinct tasks grew; an estimate
# within PLAN_REACH of the need doubles the walk, up to PLAN_LONGEST_WALK candidates.
PLAN_EXECUTION_YIELD = 0.7
PLAN_SAMPLE = 1000
PLAN_REACH = 2.0
PLAN_LONGEST_WALK = 16_000
# A data source is exhausted when a round that made at least EXHAUSTION_MIN_CANDIDATES of its candidates turned
# fewer than EXHAUSTION_YIELD of them into rows (as single operators do once their distinct programs are used
# up and most candidates repeat earlier ones): each further row would cost over a hundred candidates. Its missing
# rows then go to the largest data source of the mixture that still yields, so the set keeps its size;
# stats.json and the card say so.
EXHAUSTION_YIELD = 0.01
EXHAUSTION_MIN_CANDIDATES = 1000

# glibc malloc arenas the generate driver's threads share (pipeline.heap): two, from its start, kept its resident
# memory from creeping up round after round; the execution's worker processes keep glibc's default.
DRIVER_MALLOC_ARENAS = 2

# The execution workers' time per phase of a task is counted under this prefix, summed over workers.
WORKER_PREFIX = "worker_"

# Output shards.
MAX_ROWS_PER_SHARD = 10_000
ROW_GROUP_ROWS = 1_000
