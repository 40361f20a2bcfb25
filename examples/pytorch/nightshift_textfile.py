"""Tell the nightshift agent how a training job is doing.

The agent reads `*.prom` files in its `job_metrics_dir` (see
agent/src/node/jobfile.rs for the contract). Call `step()` once per
training step and `write()` every few seconds (or let `step()` do it):

    from nightshift_textfile import JobTextfile
    tf = JobTextfile(job="llama-70b")          # NIGHTSHIFT_JOB_METRICS_DIR or /run/nightshift/jobs
    for batch in loader:
        t0 = time.monotonic()
        loss = train_step(batch)
        tf.record_step(step_ms=(time.monotonic() - t0) * 1000, allreduce_ms=last_allreduce_ms)

It writes, atomically (temp file, then rename):

    nightshift_job_progress <steps>
    nightshift_gpu_mem_fragmentation_pct{gpu="<i>"} <inactive split bytes / reserved, in % (else 1 - allocated/reserved)>
    nightshift_gpu_mem_peak_allocated_pct{gpu="<i>"} <peak allocated / the GPU's memory, in %: what the job needs>
    nightshift_job_oom_events_total <out-of-memory errors the allocator caught>
    nightshift_comm_overhead_pct <all-reduce share of step time, over the last steps>
    nightshift_allreduce_p99_ms <p99 of the last steps' all-reduce times>

and, from a heartbeat thread outside the training loop (`start_heartbeat()`;
its own file, `<job>.heartbeat.prom`), so that a hung loop — a collective
that never completes — still says how long it has been stuck:

    nightshift_job_heartbeat_timestamp_seconds <now>
    nightshift_job_last_progress_timestamp_seconds <when the loop last advanced>
    nightshift_job_world_size <GPUs in the job, across nodes>

The heartbeat stops with the process, so a finished job is never "stalled".

The allocator figures come from `torch.cuda.memory_stats`, behind
`memory_stats`, a function you (or a test) may replace: it maps a GPU index
to `{"allocated_bytes.all.current": …, "reserved_bytes.all.current": …,
"inactive_split_bytes.all.current": …, "allocated_bytes.all.peak": …,
"num_ooms": …}`; the GPU's memory size from `total_bytes` (default
`torch.cuda.get_device_properties(i).total_memory`). Framebuffer used, as
NVML reads it, counts the allocator's cache: nightshift's headroom row (H7)
reads the peak allocated figure instead where a job writes it.
"""

import os
import tempfile
import threading
import time

DEFAULT_DIR = "/run/nightshift/jobs"


def torch_memory_stats(gpu):
    import torch  # only when no other source is given

    return torch.cuda.memory_stats(gpu)


def torch_total_bytes(gpu):
    import torch

    return torch.cuda.get_device_properties(gpu).total_memory


def torch_gpus():
    import torch

    return list(range(torch.cuda.device_count()))


class JobTextfile:
    def __init__(
        self,
        job,
        directory=None,
        gpus=None,
        memory_stats=None,
        window=100,
        write_every_secs=5.0,
        world_size=None,
        total_bytes=None,
    ):
        self.directory = directory or os.environ.get("NIGHTSHIFT_JOB_METRICS_DIR", DEFAULT_DIR)
        self.path = os.path.join(self.directory, f"{job}.prom")
        self.heartbeat_path = os.path.join(self.directory, f"{job}.heartbeat.prom")
        self.world_size = world_size or int(os.environ.get("WORLD_SIZE", "0")) or None
        self.memory_stats = memory_stats or torch_memory_stats
        self.total_bytes = total_bytes or torch_total_bytes
        self.gpus = gpus if gpus is not None else torch_gpus()
        self.window = window
        self.write_every_secs = write_every_secs
        self.steps = 0
        self.step_ms = []
        self.allreduce_ms = []
        self._last_write = 0.0
        self.last_progress = time.time()
        self._heartbeat = None

    def record_step(self, step_ms=None, allreduce_ms=None, steps=1):
        """One (or `steps`) training steps done; the times are optional."""
        self.steps += steps
        if steps > 0:
            self.last_progress = time.time()
        if step_ms is not None and allreduce_ms is not None and step_ms > 0:
            self.step_ms = (self.step_ms + [step_ms])[-self.window :]
            self.allreduce_ms = (self.allreduce_ms + [allreduce_ms])[-self.window :]
        if time.monotonic() - self._last_write >= self.write_every_secs:
            self.write()

    def fragmentation_pct(self, gpu):
        s = self.memory_stats(gpu)
        reserved = s.get("reserved_bytes.all.current", 0)
        allocated = s.get("allocated_bytes.all.current", 0)
        if reserved <= 0:
            return 0.0
        # Inactive split blocks are the free pieces the allocator cannot hand
        # out whole: fragmentation. Cached whole blocks are not.
        inactive = s.get("inactive_split_bytes.all.current")
        if inactive is not None:
            return max(0.0, min(100.0, inactive / reserved * 100.0))
        return max(0.0, min(100.0, (1.0 - allocated / reserved) * 100.0))

    def peak_allocated_pct(self, gpu):
        peak = self.memory_stats(gpu).get("allocated_bytes.all.peak")
        total = self.total_bytes(gpu)
        if peak is None or not total:
            return None
        return max(0.0, min(100.0, peak / total * 100.0))

    def lines(self):
        out = [f"nightshift_job_progress {self.steps}"]
        ooms = 0
        for g in self.gpus:
            out.append(f'nightshift_gpu_mem_fragmentation_pct{{gpu="{g}"}} {self.fragmentation_pct(g):.2f}')
            peak = self.peak_allocated_pct(g)
            if peak is not None:
                out.append(f'nightshift_gpu_mem_peak_allocated_pct{{gpu="{g}"}} {peak:.2f}')
            ooms += self.memory_stats(g).get("num_ooms", 0)
        out.append(f"nightshift_job_oom_events_total {ooms}")
        if self.step_ms:
            share = 100.0 * sum(self.allreduce_ms) / sum(self.step_ms)
            out.append(f"nightshift_comm_overhead_pct {share:.2f}")
            ordered = sorted(self.allreduce_ms)
            p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
            out.append(f"nightshift_allreduce_p99_ms {p99:.3f}")
        return out

    def heartbeat_lines(self):
        out = [
            f"nightshift_job_heartbeat_timestamp_seconds {time.time():.3f}",
            f"nightshift_job_last_progress_timestamp_seconds {self.last_progress:.3f}",
        ]
        world = self.world_size or len(self.gpus)
        if world:
            out.append(f"nightshift_job_world_size {world}")
        return out

    def _replace(self, path, lines):
        os.makedirs(self.directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-", suffix=".partial")
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(lines) + "\n")
        os.chmod(tmp, 0o644)  # the agent runs as its own user
        os.replace(tmp, path)

    def write(self):
        self._replace(self.path, self.lines())
        self._last_write = time.monotonic()

    def write_heartbeat(self):
        self._replace(self.heartbeat_path, self.heartbeat_lines())

    def start_heartbeat(self, every_secs=5.0):
        """Write the heartbeat file every `every_secs` from a daemon thread:
        it goes on while the training loop is stuck, and stops with the
        process."""

        def beat():
            while True:
                try:
                    self.write_heartbeat()
                except OSError:
                    pass
                time.sleep(every_secs)

        self._heartbeat = threading.Thread(target=beat, name="nightshift-heartbeat", daemon=True)
        self._heartbeat.start()


def _simulate(argv):
    """`python3 nightshift_textfile.py --dir D --job J [...]`: a stand-in
    training loop (no torch) for tests and demos: steps at `--steps-per-sec`
    until `--stall-after` steps, with the given fragmentation and
    communication share."""
    import argparse

    p = argparse.ArgumentParser(description=_simulate.__doc__)
    p.add_argument("--dir", required=True)
    p.add_argument("--job", default="sim-job")
    p.add_argument("--gpus", type=int, default=2)
    p.add_argument("--fragmented-gpu", type=int, default=None)
    p.add_argument("--fragmentation-pct", type=float, default=0.0)
    p.add_argument("--comm-share-pct", type=float, default=5.0)
    p.add_argument("--steps-per-sec", type=float, default=20.0)
    p.add_argument("--stall-after", type=int, default=None)
    p.add_argument("--seconds", type=float, default=60.0)
    a = p.parse_args(argv)

    def stats(gpu):
        frag = a.fragmentation_pct if gpu == a.fragmented_gpu else 2.0
        reserved = 40 << 30
        return {
            "reserved_bytes.all.current": reserved,
            "allocated_bytes.all.current": reserved * (1 - frag / 100.0),
            "allocated_bytes.all.peak": reserved,
            "num_ooms": 0,
        }

    tf = JobTextfile(
        a.job,
        directory=a.dir,
        gpus=list(range(a.gpus)),
        memory_stats=stats,
        write_every_secs=0.2,
        total_bytes=lambda gpu: 80 << 30,
    )
    tf.start_heartbeat(every_secs=0.2)
    end = time.monotonic() + a.seconds
    step_ms = 1000.0 / a.steps_per_sec
    while time.monotonic() < end:
        if a.stall_after is not None and tf.steps >= a.stall_after:
            # A hung collective: the loop never comes back; the heartbeat
            # thread goes on.
            time.sleep(step_ms / 1000.0)
            continue
        tf.record_step(step_ms=step_ms, allreduce_ms=step_ms * a.comm_share_pct / 100.0, steps=1)
        time.sleep(step_ms / 1000.0)


if __name__ == "__main__":
    import sys

    _simulate(sys.argv[1:])
