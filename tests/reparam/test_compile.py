"""``FBetaRegularizer.compile()``: the compiled per-step math (``L_B`` with its closed-form
derivatives, the sparse ``tau`` step) gives the eager results to rounding. Compiling takes ~15 s on
2 CPU cores."""

from __future__ import annotations

import pytest
import torch

from reparam import DenseTau, EpochEnd, FBetaRegularizer, Inline, ShapeHead

LABELS = torch.tensor([0, 1, 1, 0, 1, 0, 0, 1, 0, 1] * 10)  # N = 100
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _train(compiled: bool, device: str, paper: bool = False, **options):
    """Two epochs of a head and ``FBetaRegularizer(**options)`` (``paper``: its ``.paper``)."""
    torch.manual_seed(0)
    head = ShapeHead(2).to(device)
    make = FBetaRegularizer.paper if paper else FBetaRegularizer
    reg = make(LABELS, lambda_init=0.3, **options).to(device)
    if compiled:
        reg.compile()
    opt = torch.optim.Adam([*head.parameters(), *reg.parameters()], lr=1e-2)
    x = (torch.linspace(-1, 1, 100)[:, None] * torch.tensor([1.0, -0.5]) + LABELS[:, None]).to(
        device
    )
    losses = []
    for _ in range(2):
        for idx in torch.randperm(100, generator=torch.Generator().manual_seed(1)).split(24):
            loss = reg(head(x[idx.to(device)]), idx)
            opt.zero_grad()
            loss.backward()
            opt.step()
            reg.after_step_()
            losses.append(loss.detach())
        reg.end_epoch_()
    return torch.stack(losses), reg


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "options",
    [dict(schedule=EpochEnd()), dict(paper=True), dict()],
    ids=["epoch-sparse", "paper-dense", "defaults"],
)
def test_compiled_regularizer_matches_eager(options, device):
    eager_losses, eager = _train(False, device, **options)
    compiled_losses, compiled = _train(True, device, **options)
    torch.testing.assert_close(compiled_losses, eager_losses, rtol=1e-5, atol=1e-6)
    for name, value in eager.state_dict().items():
        torch.testing.assert_close(compiled.state_dict()[name], value, rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # compiles (tens of seconds on 2 cores)
def test_compile_covers_every_objective_and_after_step():
    """``reg.compile()`` is the base's: the rate objectives compile too, and ``after_step_`` goes
    through its own compiled graph."""
    from reparam import PrecisionAtRecall

    reg = PrecisionAtRecall(LABELS, recall=0.9)
    reg.compile()
    assert reg._compiled_forward is not None and reg._compiled_after_step is not None
    eager = PrecisionAtRecall(LABELS, recall=0.9)
    gen = torch.Generator().manual_seed(0)
    for idx in torch.randperm(100, generator=gen).split(25):
        u = torch.randn(25, generator=gen)
        for r in (reg, eager):
            r(u.clone().requires_grad_(), idx).backward()
            r.after_step_()
    for name, value in eager.state_dict().items():
        torch.testing.assert_close(reg.state_dict()[name], value, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.cuda
def test_cuda_graphs_capture_the_step_and_match_eager():
    """``reg.compile(mode="reduce-overhead")`` on CUDA: forward, backward and ``after_step_``
    replay as CUDA graphs (no cudagraph skipped), static shapes (every batch of 25), and the
    state equals eager's."""
    from torch._dynamo.utils import counters

    counters.clear()
    torch.manual_seed(0)
    labels = LABELS.repeat(4)  # 400 samples
    regs = {}
    for compiled in (False, True):
        reg = FBetaRegularizer(labels, lambda_init=0.3).cuda()
        if compiled:
            reg.compile(mode="reduce-overhead")
        opt = torch.optim.Adam(reg.parameters(), lr=1e-2)
        gen = torch.Generator().manual_seed(1)
        for _ in range(2):
            for idx in torch.randperm(400, generator=gen).split(25):
                torch.compiler.cudagraph_mark_step_begin()  # a new iteration (CUDA graphs)
                u = torch.randn(25, generator=gen).cuda().requires_grad_()
                loss = reg(u, idx.cuda())
                opt.zero_grad()
                loss.backward()
                opt.step()
                reg.after_step_()
            reg.end_epoch_()
        regs[compiled] = reg
    assert counters["inductor"]["cudagraph_skips"] == 0
    for name, value in regs[False].state_dict().items():
        torch.testing.assert_close(regs[True].state_dict()[name], value, rtol=1e-4, atol=1e-5)


@pytest.mark.cuda
def test_cuda_graphs_replay_a_users_compiled_step_without_recording_again():
    """A user's ``torch.compile(mode="reduce-overhead")`` of model + loss + regularizer (the
    sparse ``tau`` stepped in its backward) and of the optimizer's step: after warm-up every
    step replays, none records a CUDA graph again, and ``tau`` moves every step."""
    from benchmarks._timing import Recordings
    from benchmarks.reg_loop import Loop, _batches

    loop = Loop("cuda", True, "cudagraphs")
    batches = _batches("cuda", 100, 8)
    for k in range(5):  # warm-up: compile, warm up, record
        loop.step(*batches[k % 8])
    steps = int(loop.reg.sparse_tau.step)
    with Recordings() as recorded:
        for k in range(12):
            loop.step(*batches[k % 8])
    torch.cuda.synchronize()
    assert recorded.count == 0
    assert int(loop.reg.sparse_tau.step) == steps + 12


@pytest.mark.slow  # compiles (tens of seconds on 2 cores)
def test_inline_compiles_with_graph_breaks_and_matches_eager():
    """Mode ``"inline"``'s exact root search reads values: ``compile()`` takes it with graph breaks
    (no ``fullgraph``) instead of failing, and the step is eager's."""
    inline = dict(schedule=Inline(), tau=DenseTau())
    eager_losses, eager = _train(False, "cpu", **inline)
    compiled_losses, compiled = _train(True, "cpu", **inline)
    torch.testing.assert_close(compiled_losses, eager_losses, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(compiled.tau_param, eager.tau_param, rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # compiles (tens of seconds on 2 cores)
def test_many_compiled_regularizers_in_one_process():
    """Each regularizer compiles its own graphs: more than Dynamo's recompile limit (8) of them,
    of different sizes, each compile and step (a shared code object would fail the ninth)."""
    for k in range(10):
        reg = FBetaRegularizer((torch.arange(60 + k) % 2).long())
        reg.compile(backend="aot_eager")
        reg(torch.randn(20, requires_grad=True), torch.arange(20)).backward()
        reg.after_step_()
        assert not torch.equal(reg.tau_param, torch.ones_like(reg.tau_param))


def _symbolic_inputs(gm: torch.fx.GraphModule) -> list[str]:
    """The graph's inputs that dynamo made symbolic (a SymInt, or a tensor with a symbolic size)."""
    out = []
    for node in gm.graph.nodes:
        value = node.meta.get("example_value") if node.op == "placeholder" else None
        sizes = value.shape if isinstance(value, torch.Tensor) else [value]
        if any(isinstance(s, torch.SymInt) for s in sizes):
            out.append(node.name)
    return out


def test_a_regularizer_compiles_from_its_own_sizes_whatever_compiled_before():
    """Dynamo records the sizes each frame saw per (file, line, name) and compiles as dynamic a
    size that changed. Each regularizer's compiled functions have a name of their own, so a
    regularizer compiled after others (other n, other batch sizes) compiles static graphs at
    first, as in a fresh process: what it compiles does not depend on what ran before."""
    graphs: dict[str, list[list[str]]] = {}

    def recording(tag):
        def backend(gm, _inputs):
            graphs.setdefault(tag, []).append(_symbolic_inputs(gm))
            return gm.forward

        return backend

    for tag, n, batches in (("first", 300, (50, 50, 30)), ("second", 100, (24,))):
        labels = (torch.arange(n) % 2).long()
        reg = FBetaRegularizer(labels, schedule=EpochEnd())
        reg.compile(backend=recording(tag))
        gen = torch.Generator().manual_seed(0)
        for b in batches:  # a new batch size: dynamo recompiles with dynamic sizes
            reg(torch.randn(b, generator=gen, requires_grad=True), torch.randperm(n)[:b]).backward()
            reg.after_step_()
    assert any(graphs["first"][2:]), "the first regularizer never compiled a dynamic graph"
    assert graphs["second"] and not any(graphs["second"]), graphs["second"]
