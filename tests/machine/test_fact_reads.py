"""Fact reads are declared: at run time a step that reads a fact it does not declare fails with
UndeclaredRead, and statically every `ctx.facts[...]`, `ctx.facts.get(...)` and `... in
ctx.facts` with a literal name in the step methods of every shipped component (and of the
in-memory doubles), followed into the helpers they hand `ctx` to, names a fact its step declares
in `needs`, `uses` or `makes`."""

from __future__ import annotations

import ast
import importlib
import inspect
import textwrap
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from coldsnap.capsules import StoreArtifacts
from coldsnap.drivers.n580 import N580Driver
from coldsnap.drivers.n610 import N610Driver
from coldsnap.engines.sglang import SGLangEngine
from coldsnap.machine import (
    REGISTRY,
    Fact,
    Machine,
    Spec,
    Step,
    StepContext,
    UndeclaredRead,
    fact,
)
from coldsnap.machine import steps as s
from coldsnap.providers._steps import NativeProvider, RecoveryProvider
from coldsnap.testing import (
    MemoryEngine,
    MemoryProcessDriver,
    MemoryProvider,
    MemoryStore,
    MemoryTemplateDriver,
    MemoryWorld,
)

from ._lifecycle import lifecycle_registry
from ._support import capture_request

# -- at run time ----------------------------------------------------------------------------------

SECRET = fact("test_secret", "a fact the launch makes and no later step declares (tests only)")


class _Nosy(MemoryProcessDriver):
    """Reads `test_secret` in its CUDA lock, which declares no such fact; `swallow` catches the
    error the read raises, which must not save the step."""

    swallow = False

    def cuda_lock(self, ctx: StepContext) -> dict[str, Any]:
        try:
            ctx.facts.get(SECRET.name)
        except UndeclaredRead:
            if not self.swallow:
                raise
        return super().cuda_lock(ctx)


@pytest.mark.parametrize("swallow", [False, True])
def test_a_step_reading_an_undeclared_fact_fails_the_run(tmp_path, swallow) -> None:
    world = MemoryWorld()
    request = capture_request(tmp_path)
    registry = lifecycle_registry(world)
    components = registry.components(request).by_role()
    driver = _Nosy(world, components["engine"].launcher)
    driver.swallow = swallow
    components["driver"] = driver
    receipt = Machine(**components, registry=registry).capture(request)
    assert receipt.outcome == "rolled_back"
    assert receipt.steps[-1].name == "cuda_lock"
    assert receipt.steps[-1].detail.startswith(
        "UndeclaredRead: step 'cuda_lock' (driver.cuda_lock) read fact 'test_secret', which it "
        "does not declare (needs: engine_pid; makes: cuda_pids)"
    )
    assert not world.transient(), "the run compensated"


def test_the_view_shows_only_declared_facts_and_refuses_every_kind_of_read() -> None:
    import threading

    step = Step("peek", "driver.stop_engine", "doc", side_effect=False,
                needs=(s.ENGINE_PID,), uses=(s.RUNTIME_DIR,))  # fmt: skip
    spec = Spec("stop-x", "stop", "x", [step], seeds=(s.ENGINE_PID, s.RUNTIME_DIR))
    ctx = StepContext(
        request=None, spec=spec, step=step, workdir=None, deadline=0.0,  # type: ignore[arg-type]
        facts={"engine_pid": 1, "engine_url": "http://x"}, cancel=threading.Event(),
        record=lambda facts: None,
    )  # fmt: skip
    assert dict(ctx.facts) == {"engine_pid": 1}
    assert ctx.facts.get("runtime_dir") is None and "runtime_dir" not in ctx.facts
    for read in (lambda f: f["engine_url"], lambda f: f.get("engine_url"),
                 lambda f: "engine_url" in f):  # fmt: skip
        with pytest.raises(UndeclaredRead, match="read fact 'engine_url'"):
            read(ctx.facts)
    assert len(ctx.undeclared_reads) == 3


# -- statically, over the real modules ------------------------------------------------------------

class _Any(frozenset):
    """The capabilities of a class that decides them per instance: it may have any."""

    def __contains__(self, item: object) -> bool:
        return True


ANY = _Any()
REAL = {
    "driver": {"n580": [(N580Driver, ANY)], "n610": [(N610Driver, ANY)]},
    "engine": [(SGLangEngine, ANY)],
    "provider": [(NativeProvider, {"payload"}), (RecoveryProvider, {"checkpoint"})],
    "artifacts": [(StoreArtifacts, ANY)],
}
DOUBLES = {
    "driver": {"n580": [(MemoryTemplateDriver, ANY)], "n610": [(MemoryProcessDriver, ANY)]},
    "engine": [(MemoryEngine, ANY)],
    "provider": [(MemoryProvider, {"payload"}), (MemoryProvider, {"checkpoint"})],
    "artifacts": [(MemoryStore, ANY)],
}


class _Stub:
    def __init__(self, capabilities: Any) -> None:
        self.capabilities = capabilities


def _classes(kit: dict[str, Any], spec: Spec, step: Step, role: str) -> list[tuple[type, Any]]:
    """The classes of `role` that run `step`: a driver's methods are its own (the spec's
    owner's); a guarded step runs only on a class whose capabilities let its guard hold."""
    found = kit[role]
    if isinstance(found, dict):
        found = found.get(spec.owner, [])
    picked = []
    for cls, capabilities in found:
        components = {r: _Stub(ANY) for r in ("driver", "engine", "provider", "artifacts")}
        components[role] = _Stub(capabilities)
        if step.when is None or step.when.holds(object(), components):
            picked.append((cls, capabilities))
    return picked


def _is_facts(node: ast.AST, ctx_names: set[str]) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "facts"
        and isinstance(node.value, ast.Name)
        and node.value.id in ctx_names
    )


def _name(node: ast.AST, scope: dict[str, Any]) -> str | None:
    """A literal fact name: "x", or `X.name` / `s.X.name` of a declared Fact."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Attribute) and node.attr == "name":
        try:
            value = eval(compile(ast.Expression(node.value), "<fact>", "eval"), scope)
        except Exception:
            return None
        return value.name if isinstance(value, Fact) else None
    return None


def _operation_test(node: ast.AST, operation: str, caps: Any = ANY) -> bool | None:
    """Whether a branch's test holds for `operation` and a component with `caps`, where it
    compares `<...>.operation` with a literal or tests `"name" in self.capabilities` (alone or
    in an `and` chain); None where it does not say."""
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And):
        parts = [_operation_test(v, operation, caps) for v in node.values]
        return False if False in parts else None
    if (
        isinstance(node, ast.Compare)
        and len(node.ops) == 1
        and isinstance(node.ops[0], ast.In | ast.NotIn)
        and isinstance(node.left, ast.Constant)
        and isinstance(node.comparators[0], ast.Attribute)
        and node.comparators[0].attr == "capabilities"
        and not isinstance(caps, _Any)
    ):
        return (node.left.value in caps) == isinstance(node.ops[0], ast.In)
    if (
        isinstance(node, ast.Compare)
        and len(node.ops) == 1
        and isinstance(node.left, ast.Attribute)
        and node.left.attr == "operation"
        and isinstance(node.comparators[0], ast.Constant)
    ):
        same = node.comparators[0].value == operation
        if isinstance(node.ops[0], ast.Eq):
            return same
        if isinstance(node.ops[0], ast.NotEq):
            return not same
    return None


def _walk(node: ast.AST, operation: str, caps: Any) -> Iterator[ast.AST]:
    """ast.walk, leaving out the branches that do not run for `operation` and `caps` (and what
    follows a branch that runs and returns)."""
    yield node
    if isinstance(node, ast.If | ast.IfExp):
        held = _operation_test(node.test, operation, caps)
        yield from _walk(node.test, operation, caps)
        for branch, runs in ((node.body, held is not False), (node.orelse, held is not True)):
            if runs:
                yield from _block(branch if isinstance(branch, list) else [branch], operation, caps)
        return
    for value in (v for _, v in ast.iter_fields(node)):
        if isinstance(value, list) and value and all(isinstance(v, ast.stmt) for v in value):
            yield from _block(value, operation, caps)
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, ast.AST):
                    yield from _walk(item, operation, caps)
        elif isinstance(value, ast.AST):
            yield from _walk(value, operation, caps)


def _block(nodes: list[Any], operation: str, caps: Any) -> Iterator[ast.AST]:
    for node in nodes:
        yield from _walk(node, operation, caps)
        if (
            isinstance(node, ast.If)
            and _operation_test(node.test, operation, caps) is True
            and isinstance(node.body[-1], ast.Return | ast.Raise)
        ):
            return  # the rest of the block does not run


def _reads(
    fn: Callable[..., Any],
    owner: type | None,
    seen: set[Any],
    operation: str = "",
    caps: Any = ANY,
) -> Iterator[tuple[str, str]]:
    """(fact name or '<dynamic>', where) for every read of ctx.facts in `fn` and in the methods
    of `owner` and the module functions it calls with `ctx`, on the branches that run for
    `operation`."""
    fn = inspect.unwrap(fn)
    if fn in seen or not inspect.isfunction(fn):
        return
    seen.add(fn)
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return
    tree = ast.parse(source)
    scope = dict(fn.__globals__)
    for node in ast.walk(tree):  # a function's own imports name facts too
        if isinstance(node, ast.ImportFrom):
            package = fn.__module__.rpartition(".")[0]
            module = importlib.import_module("." * node.level + (node.module or ""), package)
            for alias in node.names:
                scope[alias.asname or alias.name] = getattr(module, alias.name)
    ctx_names = {"ctx"}
    where = f"{fn.__module__}.{fn.__qualname__}"
    for node in _walk(tree, operation, caps):
        key = None
        if isinstance(node, ast.Subscript) and _is_facts(node.value, ctx_names):
            key = node.slice
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and _is_facts(node.func.value, ctx_names)
            and node.args
        ):
            key = node.args[0]
        elif (
            isinstance(node, ast.Compare)
            and any(isinstance(op, ast.In | ast.NotIn) for op in node.ops)
            and any(_is_facts(c, ctx_names) for c in node.comparators)
        ):
            key = node.left
        if key is not None:
            yield (_name(key, scope) or "<dynamic>", where)
        if isinstance(node, ast.Call) and any(
            isinstance(a, ast.Name) and a.id in ctx_names for a in node.args
        ):
            callee = _callee(node.func, owner, scope)
            if callee is not None:
                yield from _reads(callee, owner, seen, operation, caps)


def _callee(func: ast.AST, owner: type | None, scope: dict[str, Any]) -> Any:
    if (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and func.value.id == "self"
        and owner is not None
    ):
        return inspect.getattr_static(owner, func.attr, None)
    try:
        value = eval(compile(ast.Expression(func), "<callee>", "eval"), scope)
    except Exception:
        return None
    return value if inspect.isfunction(value) and value.__module__.startswith("coldsnap") else None


def _undeclared(kit: dict[str, Any]) -> list[str]:
    problems = []
    for spec in REGISTRY.specs():
        for step in spec.steps:
            allowed = step.reads()
            for action in filter(None, (step.action, step.compensation)):
                role, method = action.split(".", 1)
                for cls, caps in _classes(kit, spec, step, role):
                    fn = inspect.getattr_static(cls, method, None)
                    if fn is None:
                        continue
                    for name, where in _reads(fn, cls, set(), spec.operation, caps):
                        if name not in allowed:
                            problems.append(
                                f"{spec.name}/{step.name} ({action} on {cls.__name__}) reads "
                                f"{name} in {where}"
                            )
    return sorted(set(problems))


@pytest.mark.parametrize("kit", [REAL, DOUBLES], ids=["components", "doubles"])
def test_every_step_method_reads_only_what_its_step_declares(kit) -> None:
    problems = _undeclared(kit)
    assert not problems, "undeclared fact reads:\n" + "\n".join(problems)


def test_the_scan_finds_reads() -> None:
    """The scan is not vacuous: it finds the reads of a method it is pointed at."""
    found = {name for name, _ in _reads(MemoryEngine.check_acceptance, MemoryEngine, set())}
    assert s.CAPSULE.name in found


def test_the_scan_leaves_out_branches_of_other_operations() -> None:
    def step(ctx: Any) -> None:
        if ctx.request.operation == "restore":
            ctx.facts.get("capsule")
        elif ctx.request.operation != "capture" and ctx.ready:
            ctx.facts["stop_only"]
        else:
            ctx.facts["capture_or_stop"]

    def names(operation: str) -> set[str]:
        return {name for name, _ in _reads(step, None, set(), operation)}

    assert names("restore") == {"capsule"}
    assert names("capture") == {"capture_or_stop"}
    assert names("stop") == {"stop_only", "capture_or_stop"}


def _ctx(step: Step, facts: dict[str, Any]) -> StepContext:
    import threading

    spec = Spec("restore-x", "restore", "x", [step]) if not step.needs else Spec(
        "stop-x", "stop", "x", [step], seeds=step.needs
    )
    return StepContext(
        request=None, spec=spec, step=step, workdir=None, deadline=0.0,  # type: ignore[arg-type]
        facts=facts, cancel=threading.Event(), record=lambda facts: None,
    )  # fmt: skip


def test_captured_reads_a_carried_fact_by_its_declaration() -> None:
    from coldsnap.machine import SpecError

    step = Step("read", "driver.stop_engine", "doc", side_effect=False, needs=(s.CAPSULE,))
    ctx = _ctx(step, {"capsule": {"tp_size": 2}})
    assert ctx.captured(s.TP_SIZE) == 2
    assert ctx.captured(s.RANK_PIDS) is None and ctx.captured(s.RANK_PIDS, {}) == {}
    with pytest.raises(SpecError, match="'engine_pid' from the capsule, but that fact is not"):
        ctx.captured(s.ENGINE_PID)
    bare = Step("read", "driver.stop_engine", "doc", side_effect=False)
    with pytest.raises(UndeclaredRead, match="read fact 'capsule'"):
        _ctx(bare, {"capsule": {"tp_size": 2}}).captured(s.TP_SIZE)
