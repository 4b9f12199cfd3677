"""tokamax C++ kernels (see the tokamax_cpp package)"""

from collections.abc import Callable, Sequence

from tokamax_cpp import CacheMissError as CacheMissError


def version() -> str: ...

def device_kind() -> str: ...

def num_threads() -> int: ...

def set_num_threads(n: int) -> None: ...

def op_names() -> list[str]:
    """The names of every op family, backward families included."""

def describe(op: str) -> object:
    """
    An op's description: its arguments, outputs, backward and aliases (a dict).
    """

def output_specs(op: str, arguments: object) -> list:
    """
    The outputs' (shape, dtype) of an argument spec (as `tokamax specs` prints them).
    """

def call(op: str, arrays: list, statics: dict, implementation: object | None = None, config: object | None = None, heuristics_only: bool = False) -> tuple:
    """
    Runs op on arrays ((name, keyword, array) triples) and statics (a dict) named as in its description; returns every output. The package's typed functions are built on this.
    """

def arg_specs(op: str | None = None, tag: str | None = None) -> list:
    """
    The named workloads (tokamax specs) of op (None: every op's) with tag (None: any).
    """

def implementation_names(op: str) -> list[str]:
    """An op's implementations in their default order, then the reference."""

class PackedRhs:
    """Weights packed once for the native kernel (pack_rhs); immutable."""

    @property
    def shape(self) -> tuple: ...

    @property
    def dtype(self) -> str: ...

    @property
    def dim_nums(self) -> str: ...

    @property
    def bf16_dot(self) -> bool: ...

    def __repr__(self) -> str: ...

def pack_rhs(rhs: object | None, dim_nums: str = 'forward', precision: object | None = None) -> PackedRhs: ...

def ragged_dot(lhs: object | None, rhs: object | None, group_sizes: object | None, *, preferred_element_type: object | None = None, activation: object | None = None, precision: object | None = None, implementation: object | None = None, config: object | None = None, representative_group_sizes: object | None = None, out: object | None = None, heuristics_only: bool = False) -> object: ...

def ragged_dot_general(lhs: object | None, rhs: object | None, group_sizes: object | None, dim_nums: str, *, preferred_element_type: object | None = None, activation: object | None = None, precision: object | None = None, implementation: object | None = None, config: object | None = None, heuristics_only: bool = False) -> object: ...

def ragged_dot_vjp(lhs: object | None, rhs: object | None, group_sizes: object | None, dout: object | None, *, preferred_element_type: object | None = None, activation: object | None = None, precision: object | None = None, implementation: object | None = None, heuristics_only: bool = False) -> tuple: ...

class PackedGluWeights:
    """GLU weights packed once for the native kernel; immutable."""

    @property
    def k(self) -> int: ...

    @property
    def n(self) -> int: ...

    @property
    def dtype(self) -> str: ...

def pack_glu_weights(weights: object | None) -> PackedGluWeights: ...

def gated_linear_unit(x: object | None, weights: object | None, *, activation: object | None = None, implementation: object | None = None, config: object | None = None, return_residuals: bool = False, heuristics_only: bool = False) -> object: ...

def gated_linear_unit_vjp(x: object | None, weights: object | None, h: object | None, dout: object | None, *, activation: object | None = None, implementation: object | None = None, config: object | None = None, heuristics_only: bool = False) -> tuple: ...

def query_configs(fn: Callable) -> list:
    """
    Runs fn() with every op call on this thread resolved but not run (outputs unwritten); returns, per call, its op, implementation, heuristics config and the config the ladder (scopes, disk cache, heuristics) would choose.
    """

class BoundArguments:
    """
    An op call's identity: family, implementation, canonical argument spec (shapes, dtypes, statics; never array values).
    """

    @property
    def op(self) -> str: ...

    @property
    def implementation(self) -> str: ...

    @property
    def key(self) -> str: ...

    @property
    def arguments(self) -> object: ...

    def to_json(self) -> str: ...

    @staticmethod
    def from_json(json: object) -> BoundArguments: ...

    def __eq__(self, arg: BoundArguments, /) -> bool: ...

    def __hash__(self) -> int: ...

    def __repr__(self) -> str: ...

def dump_bound_args(arg: Sequence[BoundArguments], /) -> str: ...

def load_bound_args_file(path: str) -> list: ...

def load_bound_args(text: str) -> list: ...

def get_bound_args(fn: Callable, *args) -> list:
    """The bound arguments of every op call fn(*args) makes on this thread."""

class AutotuningResult:
    """
    Tuned configs per key. `with result:` applies them to the op calls made on the entering thread (a C++ thread-local scope: other threads, such as a thread pool's, do not see it); scopes nest, innermost first.
    """

    def __init__(self) -> None: ...

    @property
    def device_kind(self) -> str: ...

    @property
    def tokamax_version(self) -> str: ...

    @property
    def data(self) -> list: ...

    def __len__(self) -> int: ...

    def dumps(self) -> str: ...

    @staticmethod
    def loads(text: str) -> AutotuningResult: ...

    def dump(self, path: str) -> None: ...

    @staticmethod
    def load(path: str) -> AutotuningResult: ...

    def dump_cache(self, dir: str = '') -> None: ...

    def __or__(self, arg: AutotuningResult, /) -> AutotuningResult: ...

    def __enter__(self) -> object: ...

    def __exit__(self, exc_type: object | None, exc_value: object | None, traceback: object | None) -> bool: ...

    def __repr__(self) -> str: ...

def autotune_fn(fn: Callable, args: tuple, ignore_cache: bool = False, all_implementations: bool = False, budget_s: float | None = None, measure_budget_s: float | None = None, max_candidates: int | None = None, seed: int = 0) -> AutotuningResult: ...

def autotune_bound_args(bound_args: Sequence[BoundArguments], ignore_cache: bool = False, all_implementations: bool = False, budget_s: float | None = None, measure_budget_s: float | None = None, max_candidates: int | None = None, seed: int = 0) -> AutotuningResult: ...

def autotune_sharded(bound_args: Sequence[BoundArguments], store: str, run_id: str, rank: int | None = None, world_size: int | None = None, lease_s: float = 30.0, deadline_s: float = 86400.0, all_implementations: bool = False, budget_s: float | None = None, measure_budget_s: float | None = None, max_candidates: int | None = None, seed: int = 0) -> AutotuningResult: ...
