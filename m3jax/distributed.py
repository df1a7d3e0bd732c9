"""Multi-process (pod) start-up on JAX's own distributed runtime, and the global mesh over every process's devices.

A pod is one Python process per host (TPU VM worker, SLURM task, Kubernetes pod), all running the same command.
Each calls `initialize(cfg)` before any JAX computation; JAX's coordination service (process 0 serves it at
`coordinator_address`) then exposes every process's devices in `jax.devices()`, and a jitted step over a mesh
of them runs as one SPMD program. Nothing here launches processes: the cluster does that.

Settings, in order of precedence: explicit `DistributedConfig` fields (`--set distributed.*` on every entry
point), then these environment variables for fields left unset:

  M3JAX_COORDINATOR        host:port of process 0's coordination service
  M3JAX_NUM_PROCESSES      number of processes
  M3JAX_PROCESS_ID         this process's index, 0..N-1
  M3JAX_LOCAL_DEVICE_IDS   comma-separated local device ids this process uses (default: all)

and, with `auto=True`, JAX's own cluster detection fills whatever is still unset (Cloud TPU VMs, SLURM, Open
MPI; see `jax.distributed.initialize`). On CPU the cross-process collectives are gloo's.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import socket
from typing import Mapping

import jax
import numpy as np
from jax.sharding import Mesh

from m3jax import parallel
from m3jax.errors import UserError

ENV = {"coordinator_address": "M3JAX_COORDINATOR", "num_processes": "M3JAX_NUM_PROCESSES",
       "process_id": "M3JAX_PROCESS_ID", "local_device_ids": "M3JAX_LOCAL_DEVICE_IDS"}


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
  """`enabled=False` (the default): one process, `initialize` does nothing. `None` fields come from the
  environment (M3JAX_*), then, with `auto`, from JAX's cluster detection."""
  enabled: bool = False
  auto: bool = False
  coordinator_address: str | None = None  # "host:port"
  num_processes: int | None = None
  process_id: int | None = None
  local_device_ids: tuple[int, ...] | None = None
  initialization_timeout: int = 300  # seconds to wait for every process to join
  heartbeat_timeout: int = 100  # seconds without a heartbeat after which a process is declared dead
  shutdown_timeout: int = 300  # seconds a finishing process waits at the shutdown barrier for the others

  def __post_init__(self):
    if self.num_processes is not None and self.num_processes < 1:
      raise ValueError(f"distributed.num_processes={self.num_processes}; expected >= 1")
    if self.process_id is not None and (self.process_id < 0 or (
        self.num_processes is not None and self.process_id >= self.num_processes)):
      raise ValueError(f"distributed.process_id={self.process_id} is not in 0..{(self.num_processes or 1) - 1}")
    if self.coordinator_address is not None:
      _split_address(self.coordinator_address)
    if min(self.initialization_timeout, self.heartbeat_timeout, self.shutdown_timeout) < 1:
      raise ValueError("distributed.initialization_timeout, heartbeat_timeout and shutdown_timeout must be >= 1 s")
    if self.local_device_ids is not None and (not self.local_device_ids or min(self.local_device_ids) < 0):
      raise ValueError(f"distributed.local_device_ids={self.local_device_ids}; expected non-negative ids")

  def from_env(self, environ: Mapping[str, str] | None = None) -> "DistributedConfig":
    """This config with its unset fields read from the M3JAX_* variables (and `enabled` when any is set)."""
    environ = os.environ if environ is None else environ
    updates: dict = {}
    for field, var in ENV.items():
      raw = environ.get(var, "").strip()
      if not raw or getattr(self, field) is not None:
        continue
      try:
        updates[field] = (raw if field == "coordinator_address" else
                          tuple(int(x) for x in raw.split(",")) if field == "local_device_ids" else int(raw))
      except ValueError:
        raise ValueError(f"{var}={raw!r} is not valid") from None
    if updates:
      updates["enabled"] = True
    return dataclasses.replace(self, **updates)


def _split_address(address: str) -> tuple[str, int]:
  host, sep, port = address.rpartition(":")
  if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
    raise ValueError(f"distributed.coordinator_address={address!r}; expected host:port")
  return host, int(port)


_ACTIVE: DistributedConfig | None = None


def initialize(cfg: DistributedConfig) -> None:
  """Joins the pod described by `cfg` (with env / auto-detected values); idempotent for the same settings.

  Must run before any JAX computation. A coordinator port that process 0 cannot bind, or processes that do not
  all join within `initialization_timeout`, raise a one-line UserError."""
  global _ACTIVE
  cfg = cfg.from_env()
  if not cfg.enabled:
    return
  if _ACTIVE is not None:
    if _ACTIVE != cfg:
      raise UserError(f"the distributed runtime is already initialised with different settings ({_ACTIVE})")
    return
  if not cfg.auto and None in (cfg.coordinator_address, cfg.num_processes, cfg.process_id):
    raise UserError("distributed.enabled needs coordinator_address, num_processes and process_id (--set "
                    "distributed.*=... or M3JAX_COORDINATOR / M3JAX_NUM_PROCESSES / M3JAX_PROCESS_ID), "
                    "or distributed.auto=true on a TPU VM / SLURM / MPI cluster")
  if cfg.process_id == 0 and cfg.coordinator_address is not None:
    _check_bindable(cfg.coordinator_address)
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  try:
    jax.distributed.initialize(
        cfg.coordinator_address, cfg.num_processes, cfg.process_id,
        local_device_ids=None if cfg.local_device_ids is None else list(cfg.local_device_ids),
        cluster_detection_method=None if cfg.auto else "deactivate",
        initialization_timeout=cfg.initialization_timeout, heartbeat_timeout_seconds=cfg.heartbeat_timeout,
        shutdown_timeout_seconds=cfg.shutdown_timeout)
  except Exception as e:  # XlaRuntimeError (DEADLINE_EXCEEDED, UNAVAILABLE), RuntimeError, ValueError
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise UserError(f"distributed start-up failed (coordinator {cfg.coordinator_address}, process "
                    f"{cfg.process_id} of {cfg.num_processes}): {first}") from None
  _ACTIVE = cfg


def _check_bindable(address: str) -> None:
  """Process 0 serves the coordinator: a busy or foreign port fails here in one line instead of in gRPC."""
  host, port = _split_address(address)
  with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
    try:
      s.bind(("" if host in ("localhost", "0.0.0.0") else host.strip("[]"), port))
    except OSError as e:
      raise UserError(f"distributed.coordinator_address={address}: cannot bind port {port} on process 0 "
                      f"({e.strerror or e}); choose a free port") from None


def global_mesh(data: int = 1, fsdp: int = 1, tensor: int = 1) -> Mesh:
  """A (data, fsdp, tensor) mesh over every process's devices, process by process, so each process's devices
  form a contiguous block of the data×fsdp rows (its local batch shard) whenever `tensor` divides its device
  count. With one process it is `parallel.make_mesh` over the local devices."""
  devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
  n = data * fsdp * tensor
  if n != len(devices):
    raise UserError(f"global mesh data={data} fsdp={fsdp} tensor={tensor} needs {n} devices; the "
                    f"{jax.process_count()} process(es) have {len(devices)}")
  if jax.process_count() > 1 and jax.local_device_count() % tensor:
    raise UserError(f"tensor={tensor} does not divide the {jax.local_device_count()} devices of a process")
  return parallel.make_mesh(data, fsdp, tensor, devices=devices)


def host_local(x: np.ndarray, sharding: jax.sharding.Sharding) -> np.ndarray:
  """The block of the global host array `x` that this process's devices hold under `sharding` (the whole
  array where it is replicated): what this process feeds `jax.make_array_from_process_local_data`."""
  index = sharding.addressable_devices_indices_map(x.shape).values()
  out = []
  for dim in range(x.ndim):
    starts = [idx[dim].start or 0 for idx in index]
    stops = [x.shape[dim] if idx[dim].stop is None else idx[dim].stop for idx in index]
    out.append(slice(min(starts), max(stops)))
  return x[tuple(out)]


def put_global(x: np.ndarray, sharding: jax.sharding.Sharding) -> jax.Array:
  """A global array from this process's block of `x` (every process passes the same global host batch, or at
  least its own block of it). One process: the same as `jax.device_put(x, sharding)`."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:  # already global (e.g. restored): re-lay it out
    return x if x.sharding.is_equivalent_to(sharding, x.ndim) else jax.jit(lambda a: a, out_shardings=sharding)(x)
  x = np.asarray(x)
  return jax.make_array_from_process_local_data(sharding, host_local(x, sharding), x.shape)


def replicate_single(tree, mesh: Mesh):
  """`tree` with every leaf that one device holds replicated over `mesh`. Optimizer `init` returns the leaves it
  does not derive from the (mesh-placed) parameters, step counts, uncommitted on one device; a checkpoint restores
  each leaf with its template's placement, so a count pinned to one device (another process's, on a pod) would
  meet parameters on the mesh in the jitted update and fail."""
  rep = parallel.replicated(mesh)
  single = lambda x: isinstance(x, jax.Array) and len(x.sharding.device_set) == 1 and mesh.size > 1
  return jax.tree.map(lambda x: put_global(np.asarray(x), rep) if single(x) else x, tree)


def to_host(x: jax.Array) -> np.ndarray:
  """The whole of a (possibly multi-process) array on every process's host."""
  if not isinstance(x, jax.Array) or x.is_fully_addressable:
    return np.asarray(x)
  from jax.experimental import multihost_utils
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def gather_bytes(data: bytes) -> list[bytes]:
  """Every process's `data`, in process order, on every process ([data] with one process). A collective: every
  process must call it. For host results (answered questions, memorized videos) that process 0 writes out, so
  the pod needs no shared filesystem."""
  if jax.process_count() == 1:
    return [data]
  from jax.experimental import multihost_utils
  sizes = np.asarray(multihost_utils.process_allgather(np.array([len(data)], np.int32))).reshape(-1)
  buf = np.zeros(max(int(sizes.max()), 1), np.uint8)
  buf[:len(data)] = np.frombuffer(data, np.uint8)
  every = np.asarray(multihost_utils.process_allgather(buf)).reshape(len(sizes), -1)
  return [every[i, :int(n)].tobytes() for i, n in enumerate(sizes)]


def gather_objects(obj) -> list:
  """Every process's picklable `obj`, in process order, on every process (a collective, like `gather_bytes`).
  The processes of a pod run the same code, so pickle is their common format; nothing else reads it."""
  if jax.process_count() == 1:
    return [obj]
  return [pickle.loads(b) for b in gather_bytes(pickle.dumps(obj))]


def interleave(shares: list[list]) -> list:
  """The global order of interleaved shards: share p holds global positions p, p + P, p + 2P, ... (P shares)."""
  out = []
  for i in range(max((len(s) for s in shares), default=0)):
    out.extend(s[i] for s in shares if i < len(s))
  return out


def shard(items: list, index: int | None = None, count: int | None = None) -> list:
  """Process `index`'s contiguous share of `items` (of `count` processes; default: this process of the pod),
  the first len % count shares one longer, so concatenating the shares in process order gives `items`."""
  index = jax.process_index() if index is None else index
  count = jax.process_count() if count is None else count
  size, extra = divmod(len(items), count)
  start = index * size + min(index, extra)
  return items[start:start + size + (index < extra)]
