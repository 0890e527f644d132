#!/usr/bin/env python3
"""torch_fsdp.py: PyTorch's distributed CPU training throughput for a keel config,
the anchor keel's FSDP is compared with in bench/compare_torch.sh.

Same model as `keel train CONFIG` (transformers' LlamaForCausalLM built by
bench/torch_train.py: fp32 master weights, eager attention by default, untied
embeddings unless the config ties them), same per-rank batch and sequence length,
AdamW with keel's hyperparameters and decay mask, gradient clipping to the
config's grad_clip (1.0) through the wrapper's own norm, random tokens, gloo on
CPU, one compute thread per rank. Each variant runs in a fresh pair of processes
(so peak RSS is that variant's own) and prints one JSON line: median tokens/s
over both ranks (world x batch x seq / step wall time, barriers around each
step) after the warm-up steps, peak RSS per rank (ru_maxrss, gathered) and,
when it failed, the exception's first line. import_rss_bytes_max is what torch and
transformers hold before the model is built (included in the peak); other_cores is
how many cores other work on the machine kept busy meanwhile (/proc/stat busy time
less this variant's own CPU time, over its wall time; driver mode only).

Variants are IMPL:STRATEGY:PRECISION, e.g. fsdp2:full_shard:fp32:
  fsdp2  torch.distributed.fsdp.fully_shard on the embedding, each decoder layer,
         the output head and the root (torchtitan's grouping); full_shard =
         reshard_after_forward=True, shard_grad_op = False, hybrid_shard = 2D mesh
         (replicate 1 x shard N), no_shard = 2D mesh (replicate N x shard 1).
  fsdp1  FullyShardedDataParallel, auto_wrap_policy per LlamaDecoderLayer,
         use_orig_params=True (for the decay mask), BACKWARD_PRE prefetch;
         FULL_SHARD / SHARD_GRAD_OP / NO_SHARD / HYBRID_SHARD (mesh 1 x N).
  ddp    DistributedDataParallel (no_shard only).
  bf16   fsdp2: MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32);
         fsdp1: MixedPrecision(param_dtype=bf16, reduce_dtype=fp32, buffer_dtype=bf16);
         ddp: torch.autocast("cpu", bf16). (keel's design: bf16 gathered weights and
         GEMMs, fp32 master weights, optimizer and gradient reduction.)
  bf16r  as bf16 but reduce_dtype=bf16 too (fsdp1/fsdp2 only).

    /opt/keel-torch/bin/python bench/torch_fsdp.py configs/tiny.json --steps 8 \
        --variants fsdp2:full_shard:fp32,ddp:no_shard:fp32
    # or one variant per launch under torchrun (rank 0 prints the line):
    /opt/keel-torch/bin/torchrun --standalone --nproc_per_node 2 bench/torch_fsdp.py \
        configs/tiny.json --variants fsdp1:full_shard:fp32
"""
import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

# One compute thread per rank; never let idle OpenMP workers spin (shared/notes/cpu.md).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OMP_NUM_THREADS", "1")

IMPLS = ("fsdp2", "fsdp1", "ddp")
STRATEGIES = ("full_shard", "shard_grad_op", "no_shard", "hybrid_shard")
PRECISIONS = ("fp32", "bf16", "bf16r")


def parse_variant(v):
    parts = v.split(":")
    if len(parts) != 3 or parts[0] not in IMPLS or parts[1] not in STRATEGIES \
            or parts[2] not in PRECISIONS:
        raise SystemExit(f"torch_fsdp.py: bad variant {v!r} (want IMPL:STRATEGY:PRECISION, "
                         f"IMPL in {IMPLS}, STRATEGY in {STRATEGIES}, PRECISION in {PRECISIONS})")
    if parts[0] == "ddp" and (parts[1] != "no_shard" or parts[2] == "bf16r"):
        raise SystemExit(f"torch_fsdp.py: ddp is no_shard with fp32 or bf16 (autocast) only: {v!r}")
    return parts


def first_line(e):
    text = str(e).strip()
    line = text.splitlines()[0] if text else ""
    return f"{type(e).__name__}: {line}" if line else type(e).__name__


# ---------------------------------------------------------------- one rank

def wrap(model, impl, strategy, precision, world, tied):
    """Wraps model for (impl, strategy, precision); returns (model, clip_fn, autocast?)."""
    import torch
    import torch.distributed as dist
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    bf16 = precision in ("bf16", "bf16r")
    reduce_dtype = torch.bfloat16 if precision == "bf16r" else torch.float32
    if impl == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        ddp = DDP(model)
        return ddp, lambda c: torch.nn.utils.clip_grad_norm_(ddp.parameters(), c), bf16

    from torch.distributed.device_mesh import init_device_mesh
    if impl == "fsdp2":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        if strategy in ("full_shard", "shard_grad_op"):
            mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("shard",))
        elif strategy == "hybrid_shard":
            mesh = init_device_mesh("cpu", (1, world), mesh_dim_names=("replicate", "shard"))
        else:  # no_shard: replicate over every rank, shard over 1 (HSDP as DDP)
            mesh = init_device_mesh("cpu", (world, 1), mesh_dim_names=("replicate", "shard"))
        reshard = strategy != "shard_grad_op"
        mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce_dtype)
              if bf16 else MixedPrecisionPolicy())
        kw = dict(mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)
        if not tied:  # a tied weight must stay in one group (the root)
            fully_shard(model.model.embed_tokens, **kw)
        for layer in model.model.layers:
            fully_shard(layer, **kw)
        if not tied:
            fully_shard(model.lm_head, **kw)
        fully_shard(model, **kw)
        return model, lambda c: torch.nn.utils.clip_grad_norm_(model.parameters(), c), False

    from torch.distributed.fsdp import (BackwardPrefetch, MixedPrecision, ShardingStrategy,
                                        FullyShardedDataParallel as FSDP)
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    kw = {}
    if strategy == "hybrid_shard":
        kw["device_mesh"] = init_device_mesh("cpu", (1, world),
                                             mesh_dim_names=("replicate", "shard"))
    else:
        kw["process_group"] = dist.group.WORLD
    fsdp = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({LlamaDecoderLayer}),
                sharding_strategy=getattr(ShardingStrategy, strategy.upper()),
                mixed_precision=(MixedPrecision(param_dtype=torch.bfloat16,
                                                reduce_dtype=reduce_dtype,
                                                buffer_dtype=torch.bfloat16) if bf16 else None),
                backward_prefetch=BackwardPrefetch.BACKWARD_PRE, limit_all_gathers=True,
                use_orig_params=True, device_id=torch.device("cpu"), **kw)
    return fsdp, lambda c: fsdp.clip_grad_norm_(c), False


def run_variant(args, variant, rank, world):
    """Runs one variant on this rank; returns this rank's result dict (raises on failure)."""
    import torch
    import torch.distributed as dist
    from torch_train import MODEL_DEFAULTS, TRAIN_DEFAULTS, build  # path set in worker()

    impl, strategy, precision = parse_variant(variant)
    with open(args.config) as f:
        keel_cfg = json.load(f)
    m = dict(MODEL_DEFAULTS, **keel_cfg.get("model", {}))
    t = dict(TRAIN_DEFAULTS, **keel_cfg.get("train", {}))
    B = args.batch or t["micro_batch_size"]
    T, V = m["max_seq_len"], m["vocab_size"]

    torch.manual_seed(0)  # same initial weights on every rank
    model = build(m, args.attn)
    # Decay mask by name, before wrapping (use_orig_params / DTensors keep the objects).
    no_decay_ids = {id(p) for n, p in model.named_parameters()
                    if p.dim() == 1 or n == "model.embed_tokens.weight"}
    model, clip, autocast = wrap(model, impl, strategy, precision, world, m["tie_embeddings"])
    decay = [p for p in model.parameters() if id(p) not in no_decay_ids]
    no_decay = [p for p in model.parameters() if id(p) in no_decay_ids]
    if len(no_decay) != len(no_decay_ids):  # wrapper replaced the parameter objects
        decay, no_decay = [], []
        for n, p in model.named_parameters():
            (no_decay if p.dim() == 1 or n.endswith("embed_tokens.weight") else decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": t["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=t["lr"], betas=(t["beta1"], t["beta2"]), eps=t["adam_eps"])
    gen = torch.Generator().manual_seed(1 + rank)

    step_s, losses = [], []
    for _ in range(args.steps):
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for _ in range(t["grad_accum_steps"]):
            tokens = torch.randint(0, V, (B, T + 1), generator=gen)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                logits = model(input_ids=tokens[:, :-1]).logits
            loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, V),
                                                     tokens[:, 1:].reshape(-1))
            (loss / t["grad_accum_steps"]).backward()
            loss_sum += loss.item()
        if t["grad_clip"] > 0:
            clip(t["grad_clip"])
        opt.step()
        dist.barrier()
        step_s.append(time.perf_counter() - t0)
        losses.append(loss_sum / t["grad_accum_steps"])
    measured = step_s[args.warmup:] or step_s
    tokens_per_step = world * B * t["grad_accum_steps"] * T
    return {
        "step_s": step_s, "step_s_median": statistics.median(measured),
        "tokens_per_s": [tokens_per_step / s for s in step_s],
        "tokens_per_s_median": tokens_per_step / statistics.median(measured),
        "loss_first": losses[0], "loss_last": losses[-1],
        "batch_per_rank": B, "seq_len": T,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def worker(args):
    """Under torchrun or the driver: RANK/WORLD_SIZE/MASTER_* in the environment."""
    import torch
    import torch.distributed as dist
    import transformers
    torch.set_num_threads(args.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.dont_write_bytecode = True  # no bench/__pycache__
    import torch_train  # noqa: F401 (the model code: its imports count as baseline)
    # What the interpreter, torch and transformers hold before any model exists.
    rss_import = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    status = 0
    for variant in args.variants.split(","):
        impl, strategy, precision = parse_variant(variant)
        out = {"config": os.path.basename(args.config).removesuffix(".json"), "variant": variant,
               "impl": impl, "strategy": strategy, "precision": precision, "world_size": world,
               "threads": args.threads, "attn": args.attn, "steps": args.steps,
               "warmup": args.warmup, "torch": torch.__version__,
               "transformers": transformers.__version__}
        try:
            res = run_variant(args, variant, rank, world)
        except Exception as e:  # noqa: BLE001 (the failure is the result)
            traceback.print_exc(file=sys.stderr)
            # Every rank reports its own failure: the other may be stuck in a collective.
            out.update(ok=False, rank=rank, error=first_line(e))
            print(json.dumps(out), flush=True)
            status = 1
            break  # the process group may be unusable now
        rss = [None] * world
        dist.all_gather_object(rss, (res.pop("peak_rss_bytes"), rss_import))
        if rank == 0:
            out.update(ok=True, error=None, peak_rss_bytes=[r[0] for r in rss],
                       peak_rss_bytes_max=max(r[0] for r in rss),
                       import_rss_bytes_max=max(r[1] for r in rss), **res)
            print(json.dumps(out), flush=True)
    # All collectives have completed (all_gather_object synchronises). Leave without
    # destroy_process_group and interpreter teardown: gloo's threads sometimes abort
    # there ("terminate called without an active exception", FSDP2 on CPU).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


# ---------------------------------------------------------------- driver

def cpu_seconds():
    """(busy, steal) CPU seconds of the whole machine so far, from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    hz = os.sysconf("SC_CLK_TCK")
    return (v[0] + v[1] + v[2] + v[5] + v[6]) / hz, v[7] / hz


def own_cpu_seconds():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def drive(args):
    """Launches each variant as a fresh group of --nproc processes; one JSON line each."""
    status = 0
    for variant in args.variants.split(","):
        impl, strategy, precision = parse_variant(variant)
        port = free_port()
        procs = []
        with tempfile.TemporaryDirectory() as tmp:
            for rank in range(args.nproc):
                env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank),
                           WORLD_SIZE=str(args.nproc), LOCAL_WORLD_SIZE=str(args.nproc),
                           MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
                cmd = [sys.executable, os.path.abspath(__file__), args.config,
                       "--variants", variant, "--steps", str(args.steps),
                       "--warmup", str(args.warmup), "--threads", str(args.threads),
                       "--attn", args.attn, "--batch", str(args.batch)]
                procs.append(subprocess.Popen(
                    cmd, env=env, stdout=open(f"{tmp}/out{rank}", "w"),
                    stderr=open(f"{tmp}/err{rank}", "w")))
            busy0, steal0 = cpu_seconds()
            own0 = own_cpu_seconds()
            t0 = time.monotonic()
            failed_at = None
            timed_out = False
            while any(p.poll() is None for p in procs):
                now = time.monotonic()
                if failed_at is None and any(p.poll() not in (None, 0) for p in procs):
                    failed_at = now
                if now - t0 > args.timeout or (failed_at and now - failed_at > args.grace):
                    timed_out = not failed_at
                    for p in procs:
                        if p.poll() is None:
                            p.kill()
                    break
                time.sleep(0.2)
            for p in procs:
                p.wait()
            # Cores other work used meanwhile: the machine's busy time less ours.
            wall = time.monotonic() - t0
            busy1, steal1 = cpu_seconds()
            load = {"other_cores": max(0.0, (busy1 - busy0) - (own_cpu_seconds() - own0)) / wall,
                    "steal_cores": (steal1 - steal0) / wall}
            lines = []
            for rank in range(args.nproc):
                for line in open(f"{tmp}/out{rank}"):
                    if line.startswith("{"):
                        lines.append(json.loads(line))
            ok = [r for r in lines if r.get("ok")]
            bad = [r for r in lines if not r.get("ok")]
            if ok and not bad:
                if any(p.returncode != 0 for p in procs):  # after the result: say so
                    ok[0]["exit_codes"] = [p.returncode for p in procs]
                print(json.dumps(dict(ok[0], **load)), flush=True)
                continue
            status = 1
            if bad:
                error = bad[0]["error"]
            elif timed_out:
                error = f"timed out after {args.timeout:.0f} s"
            else:
                # Crashed without a Python exception: last stderr line of the first to die.
                error = "exited with " + ", ".join(str(p.returncode) for p in procs)
                for rank in range(args.nproc):
                    tail = [l.strip() for l in open(f"{tmp}/err{rank}") if l.strip()]
                    if procs[rank].returncode not in (0, None, -9) and tail:
                        error += f": {tail[-1]}"
                        break
            for rank in range(args.nproc):
                err = open(f"{tmp}/err{rank}").read().strip().splitlines()
                if err:
                    print(f"torch_fsdp.py: {variant} rank {rank} stderr (last 5 lines):",
                          *err[-5:], sep="\n  ", file=sys.stderr)
            print(json.dumps({
                "config": os.path.basename(args.config).removesuffix(".json"),
                "variant": variant, "impl": impl, "strategy": strategy, "precision": precision,
                "world_size": args.nproc, "ok": False, "error": error, **load}), flush=True)
    return status


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config", help="keel config JSON (model and train sections are read)")
    ap.add_argument("--variants", default="fsdp2:full_shard:fp32",
                    help="comma-separated IMPL:STRATEGY:PRECISION list")
    ap.add_argument("--nproc", type=int, default=2, help="ranks (driver mode)")
    ap.add_argument("--threads", type=int, default=1, help="compute threads per rank")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2, help="first steps left out of the median")
    ap.add_argument("--batch", type=int, default=0,
                    help="sequences per rank (0 = the config's train.micro_batch_size)")
    ap.add_argument("--attn", default="eager", choices=["eager", "sdpa"])
    ap.add_argument("--timeout", type=float, default=900, help="seconds per variant (driver)")
    ap.add_argument("--grace", type=float, default=20,
                    help="seconds the other ranks get after one fails (driver)")
    args = ap.parse_args()
    for v in args.variants.split(","):
        parse_variant(v)
    return worker(args) if "RANK" in os.environ else drive(args)


if __name__ == "__main__":
    sys.exit(main())
