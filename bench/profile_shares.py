"""profile_shares.py: where a profiled step's time went, from a run's profile.json
(train.profile_steps) — shared by bench/ranks_threads.sh and bench/compare_torch.sh.

shares(profile) returns each kind's share of the step: GEMMs, attention, elementwise kernels
(norms, RoPE, SwiGLU, cross-entropy, casts, copies), the optimizer (AdamW, the gradient norm),
collectives issued (window gathers and reduce-scatters included), the waits for them, time
outside the backend's calls, and beside them the comm thread's wall time moving data and the
CPU time that took (None where the run had no comm thread)."""

KINDS = ("gemm", "attention", "elementwise", "optimizer", "collectives", "waits")
HEADER = ("GEMM", "attention", "elementwise", "optimizer", "collectives", "waits", "outside calls",
          "comm thread, beside", "comm thread, CPU")


def kind(op):
    if op.startswith(("matmul", "gemm")):
        return "gemm"
    if op.startswith("attention"):
        return "attention"
    if op in ("adamw_update", "sumsq"):
        return "optimizer"
    if op == "collective_wait":
        return "waits"
    if op in ("all_gather", "reduce_scatter", "allreduce", "broadcast"):
        return "collectives"
    return "elementwise"


def shares(prof):
    step = prof["step_s"]
    out = {k: 0.0 for k in KINDS}
    for o in prof["ops"]:
        out[kind(o["op"])] += o["seconds"] / step
    out["outside"] = prof["outside_calls_s"] / step
    comm = prof.get("comm_thread")
    out["comm_beside"] = comm["transfer_s"] / step if comm else None
    out["comm_cpu"] = comm["cpu_s"] / step if comm else None
    return out


def cells(s):
    """The table cells of shares(), in HEADER's order."""
    keys = KINDS + ("outside", "comm_beside", "comm_cpu")
    return ["-" if s[k] is None else f"{100 * s[k]:.1f}%" for k in keys]
