"""prestage.Loader: the three-stage pipeline as a Python iterable of batches."""

from __future__ import annotations

import atexit
import logging
import operator
import os
import weakref
from typing import TYPE_CHECKING, Any, Dict, Iterable, Iterator, List, Optional, Tuple, Union

from prestage import _core
from prestage import state as _state
from prestage.errors import ConfigError
from prestage.options import Options, load_tuned, to_core

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["Loader", "load_tuned"]

_live_loaders: "weakref.WeakSet[Loader]" = weakref.WeakSet()
_log = logging.getLogger("prestage")


@atexit.register
def _close_live_loaders() -> None:
    # Threads must be joined before the interpreter tears down the modules they may call back into.
    for loader in list(_live_loaders):
        loader.close()


def as_catalog(catalog: Union[_core.Catalog, str, "os.PathLike[str]"]) -> _core.Catalog:
    """``catalog`` itself, or the catalog saved in the file it names (``prestage catalog SRC OUT``,
    :meth:`prestage.Catalog.save`), so that a set walked once is not walked again by each job."""
    if isinstance(catalog, (str, os.PathLike)):
        if os.path.isdir(catalog):  # else C++ says only "basic_filebuf::underflow ... Is a directory"
            raise ConfigError(f"{os.fspath(catalog)!r} is a folder, not a saved catalog: pass "
                              f"prestage.Catalog.from_folder({os.fspath(catalog)!r}), or save one with "
                              "prestage catalog SOURCE OUT")
        return _core.Catalog.load(os.fspath(catalog))
    return catalog


def _count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{name} must be an integer >= 0, got {value!r}")
    return value


def select_epochs(stats: dict, epochs: Union[int, str, Iterable[int]]) -> dict:
    """``stats`` with ``stats["epochs"]`` cut to ``epochs`` (see :meth:`Loader.stats`); a new dict."""
    if epochs == "all" or "epochs" not in stats:
        return dict(stats)
    if isinstance(epochs, bool) or isinstance(epochs, str):
        raise ConfigError(f"epochs must be None, an epoch, epochs or 'all', got {epochs!r}")
    try:
        wanted = {operator.index(epochs)} if not hasattr(epochs, "__iter__") else \
            {operator.index(e) for e in epochs}  # type: ignore[union-attr]
    except TypeError:
        raise ConfigError(f"epochs must be None, an epoch, epochs or 'all', got {epochs!r}") from None
    return {**stats, "epochs": [e for e in stats["epochs"] if e["epoch"] in wanted]}


class Loader:
    """Batches of a catalog, in a seeded global order, through the three stages.

    Stage 2 copies the files of the next ``lookahead`` batches to ``stage_dir`` with ``prefetchers``
    threads; stage 3 decodes each batch with ``readers`` threads into one of ``depth`` pinned buffers
    (registered with the CUDA driver where a GPU is present, else page-locked: ``stats()["pinned"]``
    says which, ``stats()["pinned_why"]`` why). Iterating gives one epoch of :class:`prestage.Batch`
    objects whose ``images``, ``labels`` and ``indices`` are zero-copy NumPy views; a buffer is reused
    once the batch and its views are collected. Each completed epoch (its last batch delivered, with
    or without the ``StopIteration`` after it) advances the epoch (and so the shuffle); ``set_epoch``
    picks one. The pipeline runs on into the next epoch while the last batches of one are used, and
    keeps that work when the next iteration is that epoch (``set_epoch(e + 1)`` or none); any other
    epoch or position starts it anew.

    Args:
        catalog: the samples (:class:`prestage.Catalog`), or the path of a catalog saved by
            :meth:`prestage.Catalog.save` or ``prestage catalog`` (loaded with :meth:`Catalog.load`).
        batch_size: samples per batch on this rank.
        image_size: ``(height, width)``: resize the shorter side to cover it, then centre-crop
            (torchvision ``Resize`` + ``CenterCrop``). ``None``: no resize, each image keeps its own
            size; a batch of images of mixed sizes is ragged (``batch.ragged``), its ``batch.images``
            a list of N arrays ``(H_i, W_i, 3)`` (or ``(3, H_i, W_i)``).
        shuffle: a new global permutation each epoch (else catalog order).
        seed: the shuffle's seed; the same seed gives the same batches on any machine and for any
            thread counts.
        stage_dir: node-local directory for stage 2's copies; ``None`` reads the source directly. It
            may be shared with other users (``/tmp``): this data set's area in it and everything in
            it are made for the job's user alone (0700/0600, whatever the umask); an area there that
            another user owns or others can write, or a link in it, is refused
            (:class:`prestage.IoError`, errno ``EPERM``; ``ELOOP`` for a link), never used.
        stage_group: a group whose members' jobs share the node's copies (0770/0660 of that group);
            every member is then trusted with them. ``None``: the job's user alone.
        cache_bytes: the most bytes the stage directory's copies may take (files being written
            included; its index adds 40 bytes per copy made); 0: no bound; ``None`` (the default):
            no bound if the data set fits in 90% of the stage directory's room at start (its file
            system's free space plus what the directory takes already), else that 90%, counted as
            the disk counts it (each copy in whole blocks, copies being written, the index and the
            node's table), so that a node's disk is never filled up (``stats()["cache_bytes"]``
            gives the bound chosen). When the
            bound is reached, a file is staged only by evicting one used later; a file not staged (it would displace files
            needed sooner) is read from the source into memory by stage 2 instead
            (``stats()["read_ahead"]``; JPEG and raw files, up to 64 MiB per batch), so stage 3 does
            not wait on the source for it.
        eviction: ``"clairvoyant"`` (evict the file whose next use in the plan is farthest away:
            Belady's rule, optimal since the plan is known) or ``"lru"``.
        prefetchers: stage 2 threads (I/O bound: more than cores is normal).
        readers: stage 3 threads (CPU bound).
        lookahead: batches stage 2 may work on ahead of stage 3.
            Each of these three left out (or None) is sized to the machine: readers from the CPUs
            this process may use (its affinity and cgroup quota) shared among the ranks of its
            node (``LOCAL_WORLD_SIZE``, ``SLURM_NTASKS_PER_NODE``, ``OMPI_COMM_WORLD_LOCAL_SIZE``),
            less one for the training loop from 4 up; prefetchers twice that (16 to 64); lookahead
            8; both lower (never below 4) where half of
            ``memory_budget`` cannot hold that many files or batches read ahead.
            ``stats()["threads_why"]`` says what was chosen and why,
            ``loader.options`` gives the values. A value given (here or in ``tuned=``) is kept.
        autotune: while the job runs, adjust the values left out from what the pipeline measures
            (default True): while the consumer waits, the stage that holds it up gets one step
            more (readers +1 while cores are idle, up to this rank's share of the CPUs; reads in
            flight and lookahead doubled, up to 128 and 32 and ``memory_budget``), kept only if
            the batch rate rises, else undone and retried at doubling intervals. Its values and
            decisions are in ``stats()["tuning"]``, each decision is logged at INFO on the
            ``prestage`` logger, and an I/O trace records them. False: the values sized to the
            machine stay fixed. A value given is never changed.
        memory_budget: bytes the self-tuning may spend on reads in flight and read-ahead; None:
            a quarter of the memory this process may use (cgroup limit, else the machine's)
            shared by the node's ranks.
        depth: batch buffers: batches decoded ahead plus those the caller still holds.
        rank, world_size: this process's share of every global batch (distributed training).
        drop_last: drop the last, incomplete global batch (else ranks are padded to equal counts).
        decode: how a sample's bytes become its part of the batch (``batch.images`` for images,
            ``batch.arrays`` otherwise): ``"jpeg"`` (JPEG images to RGB; a PNG or WebP file is
            refused), ``"image"`` (JPEG, PNG or WebP, each told by its bytes' signature, not its
            name: PNG grey and palettes become RGB, 16-bit samples keep their high byte, alpha is
            dropped as Pillow's ``convert("RGB")`` drops it; the same transforms and limits as
            JPEG), ``"raw"`` (the bytes as they are:
            ``batch.data`` and ``batch.offsets``), ``"npy"`` (a ``.npy`` array: any dtype and
            shape, C or Fortran order), ``"npz"`` (one array of a ``.npz``, stored or deflated: see
            ``array_name``), ``"hdf5"`` (slices of a :meth:`Catalog.from_hdf5` catalog). ``None``:
            ``"hdf5"`` for an HDF5 catalog, ``"npy"`` for slices of array files
            (:meth:`Catalog.from_arrays`, ``.npy`` and ``.npz`` alike), else ``"jpeg"``. A
            sample that is a zstd frame (``.zst``) is decompressed first (all but ``"raw"``).
            Arrays of one shape make one ``(N, *shape)`` array; arrays of different shapes make a
            list (``batch.ragged``).
        max_pixels: images with more pixels are refused before decoding (decompression bombs).
        io_timeout: seconds a read may take before it fails (``IoError``, ``errno.ETIMEDOUT``, at its
            sample's batch) instead of hanging on a stalled file system; ``None``: no limit.
            Each loader has its own limit.
        stage_patience: seconds the next batch may wait for stage 2 to finish its copies; then stage 3
            takes it and reads the files no copy has started from the source itself (misses, counted
            in ``stats()["stage_expedited"]``), so a slow stage 2 never stalls training for more than
            the copies under way. A file it reads whole it also publishes as its copy where the
            stage directory has room (``stats()["misses_staged"]``): stage 2 does not read it
            again. ``None``: always wait for stage 2 (what is staged then follows the
            plan exactly, whatever the timing). A catalog whose files hold several samples each
            (shards, array and HDF5 files) always waits for the copies (``stats()["stage_patience"]``
            None): each file is copied whole for its other samples anyway, and a sample read from the
            source meanwhile would open and read its file twice.
        peers: the peer tier, beyond one node (needs ``stage_dir`` and the MPI plugin
            ``libprestage_mpi.so`` installed beside the extension): a sample not on this node is
            fetched over MPI from the stage directory of the node that owns it instead of being read
            again from the source, and kept on this node's SSD where its own plan would keep it (the
            stage directory is run as with the tier off). Launch with ``mpirun`` or ``srun``; every
            rank creates its loader together. When the MPI world does not match ``world_size`` or the plugin is missing, the
            tier is off and ``stats()["peer_tier_why"]`` says why. With the tier on, stage 3 always
            waits for stage 2 (``stats()["stage_patience"]`` None, whatever the option), so that a home copy
            is made before its sample is read. With the tier on, the loader
            belongs to the process that made it: iterated in a process forked from it (a DataLoader
            worker), it raises :class:`prestage.Error` at once. A loader made in a process forked
            from one whose loader has iterated raises :class:`prestage.Error` at construction (the
            threads' pool is copied there without its threads): make it in a process started by
            ``spawn`` or ``forkserver``. See the README, "Beyond one node".
        peer_timeout: seconds a fetch from a peer may wait for its answer before the source is read
            instead (counted in ``stats()["peer_fallbacks"]``).
        pfs_reads: with the tier on, what a read of a sample whose home copy another node holds
            goes for. ``"fastest"`` (the default: a job is never slower for the tier): that copy
            or the PFS, whichever is expected to finish first (a fast PFS is read again).
            ``"fewest"`` (a PFS shared by many jobs): that copy whenever a node holds it, waiting
            for the link rather than reading the PFS, the nodes keeping their home copies first:
            each file read from the PFS once per job where the nodes' caches hold the set.
        comm: the mpi4py intra-communicator whose ranks are the loader's ranks (``None``:
            ``MPI_COMM_WORLD``); prestage duplicates it. Any other object (a datatype, a group, a
            request, ``COMM_NULL``, an inter-communicator) is a :class:`prestage.ConfigError`.
        on_error: what a sample that cannot be read or decoded (``IoError``, ``DecodeError``, a
            timed-out read) does. ``"raise"``: its error, naming its path, is raised at its batch.
            ``"skip"``: it is replaced in its batch by the next good sample of this rank's epoch
            (the samples that follow it in the order this rank's batches run through the epoch,
            wrapping around), so batches keep their size and shape; ``batch.indices`` and
            ``batch.labels`` are the replacement's. The choice depends on the plan and the data
            alone, not on thread counts. At most 32 samples are tried; if none is good, the error
            is raised after all. ``stats()["skipped"]`` counts the replaced samples and
            ``stats()["skipped_samples"]`` lists the first 1000 (path, error, sample,
            replacement, epoch, batch). With ``decode="raw"``, arrays or JPEGs without
            ``image_size``, a sample that fails only once its batch is laid out (its size or header
            read, its data not) is replaced by one of the same size, or dtype and shape.
        transform: with ``image_size``: ``"center-crop"`` (torchvision ``Resize`` +
            ``CenterCrop``: the eval path) or ``"random-resized-crop"`` (torchvision
            ``RandomResizedCrop`` with scale (0.08, 1), ratio (3/4, 4/3), then a horizontal flip
            with p = 0.5; drawn from (seed, epoch, sample index): a rerun gives the same pixels.
            See :func:`prestage.transforms.random_resized_crop_params`).
        layout: ``"NHWC"`` or ``"NCHW"`` (images).
        dtype: ``"uint8"``, or ``"float32"``: ``(pixel / 255 - mean[c]) / std[c]`` (images).
        mean, std: per-channel (R, G, B) normalisation for ``dtype="float32"``, on the 0..1 scale
            as torchvision's ``Normalize`` after ``ToTensor``.
        array_name: ``decode="npz"``: the member to take from each archive (without ``.npy``);
            ``None``: the archive's only array.
        max_sample_bytes: an array (or raw sample) larger than this is refused before any
            allocation (lying headers, decompression bombs).
        raw_dtype: ``decode="raw"``: each sample (a file, a shard's byte range, a TFRecord
            feature) as an array of this dtype (anything ``np.dtype()`` takes: ``"<f4"``,
            ``">i2"``, ``np.uint8``), its bytes kept in their stored order (``batch.dtype`` says
            which), as ``np.frombuffer`` reads them. A sample whose size is not a whole number of
            items, or does not fit ``raw_shape``, is a :class:`prestage.DecodeError` naming it
            (``on_error="skip"`` replaces it). ``None``: the bytes as they are (uint8); a TFRecord
            ``float_list`` or ``int64_list`` feature gives float32 or int64 values, and a
            ``raw_dtype`` given for one must be that type.
        raw_shape: with ``raw_dtype``: each sample's shape, one dimension of which may be -1
            (inferred from the sample's size, as NumPy's ``reshape``); ``None``: 1-D.
        decode_device: where JPEG images with an ``image_size`` are decoded: ``"cpu"`` (the
            default: stage 3's readers) or ``"cuda"``: nvJPEG on the current CUDA device (its
            hardware JPEG engines where it has them, e.g. A100, H100), cropped, resized and
            flipped there by NPP with the same boxes as the CPU path, into a device batch per ring
            slot (NHWC uint8 only: normalise on the device). ``batch.on_device`` is then true,
            ``batch.__cuda_array_interface__`` describes the images (``torch.as_tensor(batch,
            device="cuda")`` views them without a copy; wait for ``batch.device_stream`` first, and
            let no queued work read them once the batch is collected) and ``batch.images`` is
            refused. Files the GPU cannot take (CMYK, 4:1:1, headers nvJPEG refuses, corrupt ones)
            go to the CPU path, with its errors and ``on_error`` policy; ``stats()["gpu_decode"]``
            counts where every sample went. libcudart, libnvjpeg and libnppig are opened at run
            time (``PRESTAGE_CUDART``, ``PRESTAGE_NVJPEG``, ``PRESTAGE_NPP`` name them; else the
            standard sonames, NVIDIA's wheels and torchvision's copy): without them, or without a
            device, the constructor raises :class:`prestage.ConfigError` naming what is missing.
        gpu_cpu_share: with ``decode_device="cuda"``: the fraction of each batch decoded by the
            CPU path (the last ``round(share * n)`` samples, on the readers) while the GPU decodes
            the rest. ``None`` (the default): sized at run time so that both parts of a batch finish
            together, from the times each part takes (smoothed, with a dead band so that it does
            not wander; at least one sample on each side so both stay measured; it follows the
            self-tuning's reader steps at once). A number in [0, 1) is kept as it is.
            ``stats()["gpu_decode"]`` gives the share in use and why.
        gpu_crop: with ``decode_device="cuda"``, for the images on nvJPEG's hardware engine: where
            the crop box is applied. ``"resize"``: the engine decodes whole images and NPP's resize
            reads the box out of them; ``"roi"``: the engine decodes only the box (a region per
            image; one it cannot take so goes whole to the CUDA backend) and NPP resizes it;
            ``"auto"`` (the default): the first batches are timed each way on the GPU and the
            faster is kept (``stats()["gpu_decode"]["crop"]``, ``"crop_why"``). Without a hardware
            engine, or without nvJPEG's region calls, ``"resize"``.
        tuned: a JSON file written by ``prestage tune``. Of ``prefetchers``, ``readers``,
            ``lookahead`` and ``depth``, those not passed to this call take the file's values; one
            passed always wins, even when it equals its default (precedence: the call, then the
            file, then the default). ``options`` says what is in effect.
        trace: a file to write the I/O trace to (``None``: no trace): one record per read of a
            sample's or a file's bytes (sample, tier, file, offset, size, start, end, thread), whole
            once the loader is closed. ``prestage.trace.read(path)`` gives them as a NumPy array;
            ``prestage trace FILE`` summarises them and draws the access patterns.

    Thread safety: ``stats()``, ``state_dict()`` and ``close()`` may be called from any thread at any
    time, also while another thread waits for a batch. ``stats()`` then counts the wait under way in
    ``consumer_stall_s``, and keeps its figures after ``close()``. ``close()`` wakes a waiting thread,
    which raises :class:`prestage.ConfigError` (as iterating a closed loader does), and returns once
    the loader's threads are joined; a second ``close()`` waits for the first. One iterator may be
    shared by several threads: their ``next()`` calls are served one at a time, each with the next
    batch. Iterations must not overlap: an iteration started (``iter(loader)``) while another thread
    waits for a batch may raise :class:`prestage.ConfigError`; ``set_epoch()`` and
    ``load_state_dict()`` apply to the next iteration.

    Every argument after ``image_size`` is a keyword (:class:`prestage.options.Options`); an option
    not given has its C++ default (``prestage._core.LoaderOptions()``). Values are checked in one
    place, the C++ core, whose :class:`prestage.ConfigError` names the first invalid option.

    >>> with prestage.Loader(catalog, batch_size=64, image_size=(224, 224)) as loader:
    ...     for batch in loader:
    ...         train_step(batch.images, batch.labels)
    """

    def __init__(self, catalog: Union[_core.Catalog, str, "os.PathLike[str]"], batch_size: int,
                 image_size: Optional[Tuple[int, int]] = None, **options: Unpack[Options]) -> None:
        catalog = as_catalog(catalog)
        core_options = to_core(catalog, batch_size, image_size, options)
        self._loader: Optional[_core.Loader] = _core.Loader(catalog, core_options)
        # For a resume on another layout, which the core plans from construction (_replan).
        self._catalog, self._core_options = catalog, core_options
        self._resume: Optional[Tuple[int, List[Tuple[int, int]]]] = None  # the core's plan's
        self._pending = False  # a loaded state that no iteration has started from yet
        self._options = self._loader.options
        # Kept for state_dict() and len(), which stay usable once the loader is closed.
        self._batches_per_epoch = self._loader.batches_per_epoch
        self._image_size = self._loader.image_size
        self._num_samples = len(catalog)
        self._epoch = 0
        self._first_batch = 0  # where the next iteration starts (load_state_dict)
        self._position: Tuple[int, int] = (0, 0)  # (epoch, batches delivered) of the live iteration
        self._final_stats: dict = {}  # stats() once closed
        _live_loaders.add(self)

    def __len__(self) -> int:
        """Batches per epoch (the same on every rank). An epoch resumed from another layout's state
        has fewer: :meth:`batches_in_epoch`."""
        return self._batches_per_epoch

    def batches_in_epoch(self, epoch: int) -> int:
        """Batches of ``epoch`` on every rank: ``len(loader)``, or for the epoch a state of another
        layout (or a merged one) resumed, those of its remaining samples."""
        if self._resume is None or self._resume[0] != epoch:
            return self._batches_per_epoch
        o = self._options
        return _core.batches_in_epoch(self._num_samples, o.batch_size, o.world_size, o.drop_last,
                                      self._resume[1])

    @property
    def options(self) -> _core.LoaderOptions:
        """A copy of the options in effect (after ``tuned=`` and the defaults), as C++ holds them; its
        repr shows them and ``loader.options.to_dict()`` gives them under the keywords' names
        (``stage_patience`` in seconds, ...: :func:`prestage.options.keywords`)."""
        return _core.LoaderOptions(self._options)

    @property
    def image_size(self) -> Optional[Tuple[int, int]]:
        """``decode="jpeg"``: ``(height, width)`` of every image of a batch: the ``image_size`` given.
        ``None`` without one (images keep their own sizes: ``batch.shapes``) and for the other
        decode modes."""
        return self._image_size

    @property
    def epoch(self) -> int:
        """The epoch the next iteration runs."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Chooses the epoch (and so the order) of the next iteration. The epoch of a state just
        loaded (``load_state_dict``, no iteration since) keeps its position: so the usual loop
        ``for epoch in range(state["epoch"], E): loader.set_epoch(epoch)`` resumes mid-epoch."""
        epoch = _count("epoch", epoch)
        if self._pending and epoch == self._epoch:
            return
        self._pending = False
        self._epoch, self._first_batch = epoch, 0
        if self._resume is not None and self._resume[0] == epoch:
            self._replan(None)  # the whole epoch, not what the resume left of it

    def __iter__(self) -> Iterator[_core.Batch]:
        first, self._first_batch = self._first_batch, 0
        self._pending = False
        return _EpochIterator(self, self._epoch, first)

    def state_dict(self) -> Dict[str, Any]:
        """Where the loader is: enough to resume exactly, mid-epoch, with any thread counts, and on
        any number of ranks and batch size.

        ``batch`` counts the batches of ``epoch`` already delivered to the caller: returned by the
        iterator, or raised as their sample's error (``IoError``, ``DecodeError``: iteration goes on
        past such a batch, and so does a resume). A ``next()`` that raised anything else (a closed
        loader, every buffer held, ``KeyboardInterrupt``) delivered nothing. Usable after ``close()``.

        ``position`` is the global position: the samples of the epoch's global order consumed, if
        every rank delivered ``batch`` batches (the usual case: each rank's state then says the
        same); ``consumed_beyond`` lists further ``[begin, end)`` positions consumed (after a merge
        of ranks that stopped at different batches: :func:`prestage.state.merge_states`).
        ``resumed_from``: the positions this loader's plan of the epoch left out (it resumed
        there). ``rank`` and the plan's parameters complete it. Plain values: JSON and
        ``torch.save`` keep it.
        """
        epoch, batch = self._position
        return self._state_at(epoch, batch)

    def _state_at(self, epoch: int, batch: int) -> Dict[str, Any]:
        if batch >= self.batches_in_epoch(epoch):
            epoch, batch = epoch + 1, 0
        o = self._options
        resumed_from = self._resume[1] if self._resume is not None and self._resume[0] == epoch else []
        consumed = _core.consumed_positions(self._num_samples, o.batch_size, o.world_size, o.drop_last,
                                            [batch] * o.world_size, resumed_from)
        return _state.make_state(epoch, batch, o.rank, consumed, resumed_from, self._plan())

    def _plan(self) -> Dict[str, Any]:
        o = self._options
        return {"seed": o.seed, "shuffle": o.shuffle, "batch_size": o.batch_size,
                "world_size": o.world_size, "drop_last": o.drop_last, "num_samples": self._num_samples}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Makes the next iteration resume where ``state`` (from ``state_dict()``, or
        :func:`prestage.state.merge_states`) was taken: the samples of its epoch not yet consumed,
        each once, then whole epochs.

        The seed, shuffle and catalog size must be the same (ConfigError otherwise); thread counts,
        depths, ``world_size``, ``batch_size`` and ``drop_last`` may differ. On the same
        ``world_size`` and ``batch_size`` the rest of the epoch is the very batches the
        uninterrupted run would have given. On others, the remaining samples of the epoch's global
        order are split over this loader's ranks as a whole epoch is (``batches_in_epoch(epoch)``
        batches, the same on every rank): without ``drop_last``, each rank gets ceil(R / world_size)
        of the R remaining, padded with the epoch order's first samples when world_size does not
        divide R (so up to world_size - 1 samples come once more, as in a whole epoch); with
        ``drop_last``, only whole global batches (batch_size x world_size) of them, the rest (fewer
        than that) left out of the epoch. A state whose every sample is consumed resumes at the next
        epoch. ``set_epoch()`` with the state's epoch keeps this position.

        Call it between iterations; every rank of the job loads the same global position (its own
        state in the usual case, else the merged one). On another layout the pipeline is made anew
        (the stage directory's copies stay): with the peer tier on, every rank loads together.
        """
        o = self._options
        for key in ("seed", "shuffle", "num_samples"):
            mine = self._num_samples if key == "num_samples" else getattr(o, key)
            if state.get(key) != mine:
                raise ConfigError(f"state_dict was taken with {key}={state.get(key)!r}, "
                                  f"this loader has {key}={mine!r}")
        state = _state.normalized(state)
        epoch = _count("state_dict['epoch']", state.get("epoch"))
        consumed = [(int(b), int(e)) for b, e in _state.consumed_of(state)]
        # The core's plan gives this position if some batch of its epoch ends there; else it plans
        # anew, leaving the consumed positions out.
        first = self._batch_at(epoch, consumed)
        if first is None:
            self._replan((epoch, consumed))
            first = 0
        self._epoch, self._first_batch = epoch, first
        self._position = (epoch, first)
        self._pending = True

    def _batch_at(self, epoch: int, consumed: List[Tuple[int, int]]) -> Optional[int]:
        """The batch of ``epoch`` in the core's plan after which ``consumed`` is the global position."""
        o = self._options
        resumed_from = self._resume[1] if self._resume is not None and self._resume[0] == epoch else []
        done = sum(e - b for b, e in consumed) - sum(e - b for b, e in resumed_from)
        if done < 0:
            return None
        guess = done // (o.batch_size * o.world_size)
        for batch in (guess, guess + 1):
            if batch > self.batches_in_epoch(epoch):
                break
            at = _core.consumed_positions(self._num_samples, o.batch_size, o.world_size, o.drop_last,
                                          [batch] * o.world_size, resumed_from)
            if [tuple(r) for r in at] == consumed:
                return batch
        return None

    def _replan(self, resume: Optional[Tuple[int, List[Tuple[int, int]]]]) -> None:
        """Makes the core anew with ``resume`` (None: no epoch resumed), the same options otherwise."""
        options = _core.LoaderOptions(self._core_options)
        options.resume = resume
        o = self._options
        if resume is not None:  # bad positions are a ConfigError before the old core goes
            _core.batches_in_epoch(self._num_samples, o.batch_size, o.world_size, o.drop_last, resume[1])
        # The old core leaves the stage directory (and its node table) before the new one joins.
        self._running.close()
        self._loader = None
        self._loader = _core.Loader(self._catalog, options)
        self._options = self._loader.options
        self._resume = resume if resume is not None and resume[1] else None

    def stats(self, epochs: Union[None, int, str, Iterable[int]] = None) -> dict:
        """Per-stage counters and the consumer's stall time (seconds the caller waited, the wait under
        way included); with ``on_error="skip"``, ``skipped`` and ``skipped_samples``; the peer tier's
        ``peer_tier``, ``peer_tier_why`` (why it is off), ``peer_reads``, ``peer_bytes`` (fetched
        from peers and used), ``peer_probes``, ``peer_probe_bytes`` (fetched only to measure a
        link), ``peer_fallbacks``, ``peer_corrupt``, ``beyond_budget``, ``peer_served``,
        ``peer_served_bytes`` (answers sent, to reads and probes: over a job, the ranks'
        ``peer_reads`` + ``peer_probes`` + ``peer_corrupt``, and answers that reached a rank no
        longer waiting for them), ``peers_down`` (peers that did not answer within ``peer_timeout``)
        and ``peers_closed`` (peers that said goodbye): both read from the source at once from
        then on; ``peer_reads_to_pfs`` (reads of a sample with a home copy that the source model
        sent to the PFS, expected to finish there first), ``peer_home_first`` (the node's stage
        directory keeps its home copies ahead of other files, for the other nodes' reads, while the
        links are faster than the PFS; else it is run as without the tier) and ``sources`` (per source of stage 2's
        reads, ``name`` "stage", "pfs" or "node <its lowest rank>" (another node's link):
        ``reads``, ``bytes``, and the estimates ``latency_ms``, ``mbs`` learned from ``samples``
        reads, ``down``, ``probes``: of the reads, those made only to measure the source, on a
        thread of their own, never on a batch's path); the self-tuning's
        ``tuning`` (``on``, the values in use: ``readers``, ``reads_in_flight``, ``lookahead``;
        ``steps_kept``, ``steps_undone``, ``settled_s``: when it last kept a step,
        ``memory_budget``, and ``log``: its latest decisions); ``memory``: the bytes it holds now
        for its batches (``batch_buffers``, ``read_ahead``, ``decode_scratch``: see the README's
        "Memory"); with ``decode_device="cuda"``,
        ``gpu_decode`` (``on``, ``why``: the libraries in use, ``batches``, and where each sample
        went: ``hardware``, ``gpu``, ``cpu_share``, the fallbacks ``cpu_unsupported`` and
        ``cpu_gpu_failed``, ``cpu_replacements`` for ``on_error="skip"``; ``buffer_growths`` of
        the staging buffers and ``decoders`` made, one per ring slot; ``share``: the CPU's share of
        the next batches, ``share_auto``: sized at run time, ``share_why``: from what,
        ``share_moves``, and the smoothed times per image ``gpu_ms_per_image`` (the GPU's part,
        submission to completion) and ``cpu_ms_per_image`` (the CPU's, the readers' wall time);
        ``crop``: ``"resize"`` or ``"roi"`` (``"trying"`` while the first batches are timed),
        ``crop_why``, and ``roi``: the images of which only the crop box was decoded). Any thread;
        after ``close()``, the figures at closing.

        ``epochs`` says which epochs ``stats()["epochs"]`` lists (the totals are over all of them):
        ``None`` (the default), the epoch of the last batch delivered (before any, the first epoch):
        the pipeline plans epochs ahead of the loop, and a list of them all would grow with every
        epoch of a long run; an epoch number or numbers; ``"all"``, every epoch counted so far, those
        planned ahead included."""
        loader = self._loader
        stats = self._final_stats if loader is None else loader.stats()
        return select_epochs(stats, self._position[0] if epochs is None else epochs)

    def close(self) -> None:
        """Stops the pipeline and joins its threads; any thread. A thread waiting for a batch raises
        :class:`prestage.ConfigError`. Idempotent; batches already lent stay valid."""
        loader = self._loader
        if loader is not None:
            loader.close()  # a close() under way in another thread is waited for
            self._final_stats = loader.stats()
            self._loader = None

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def _running(self) -> _core.Loader:
        if self._loader is None:
            raise ConfigError("the loader is closed")
        return self._loader


class _EpochIterator:
    """One epoch's batches. An error of one batch is raised at that batch; iteration can go on."""

    def __init__(self, loader: Loader, epoch: int, first_batch: int = 0) -> None:
        self._loader = loader
        self._epoch = epoch
        self._done = False
        self._advanced = False  # loader._epoch moved past this epoch
        loader._running.start_epoch(epoch, first_batch)
        loader._position = (epoch, first_batch)

    def __iter__(self) -> "_EpochIterator":
        return self

    def __next__(self) -> _core.Batch:
        if self._done:
            raise StopIteration
        core = self._loader._running  # ConfigError once closed: nothing delivered
        try:
            batch = core.next()
        finally:
            # The core counts a batch as delivered once returned or raised as its sample's error,
            # never on another exception (see _core.Loader.position): the position is its.
            epoch, delivered = core.position
            if epoch == self._epoch:
                self._loader._position = (epoch, delivered)
                # Its last batch delivered, the epoch is complete whether or not the caller asks
                # again (a loop of len(loader) steps, itertools.islice): the next iteration is the
                # next epoch, which the pipeline is already running into.
                if delivered >= self._loader.batches_in_epoch(epoch):
                    self._advance()
        if _log.isEnabledFor(logging.INFO):
            for line in core.take_tuning_log():
                _log.info("self-tuning at %s", line)
        if batch is None:
            self._done = True
            self._advance()  # an epoch with no batch (a resumed one) ends here
            raise StopIteration
        return batch

    def _advance(self) -> None:
        # Once per iteration, so that a set_epoch() made after it is not overwritten.
        if not self._advanced:
            self._advanced = True
            self._loader._epoch = self._epoch + 1
