// The peer tier's transport: how a rank asks a rank of another node for a byte range of a staged
// file (a sample's bytes, or the whole file), and answers such requests. The core library only
// knows this interface; its one implementation, over MPI, is a plugin (libprestage_mpi.so,
// tiers/mpi_transport.cpp) that the core opens at run time, so that neither the core library nor
// the Python extension links an MPI library (a site brings its own).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace prestage::detail {

// What a request asks for: `length` bytes at `offset` of file `file` (a sample's byte range), or
// with kWhole the whole file (offset ignored).
struct PeerRange {
  static constexpr uint64_t kWhole = ~uint64_t{0};  // as Catalog::kWholeFile
  uint64_t file = 0;
  uint64_t offset = 0;
  uint64_t length = kWhole;
};

// What a rank answers to a request.
enum class PeerAnswer : uint32_t {
  kServed = 0,  // the range's bytes, with a PeerCheck
  kAbsent = 1,  // no copy here, none coming, or a range not within the copy: the requester reads
                // the source
  kLater = 2,   // a copy is coming (a home copy not made yet): asked again until the request's time
};

// What a served answer carries beside its bytes, for the requester's checks: the CRC-32C of the
// bytes sent (of the range: the owner checked its copy against its stage index before it read the
// range) and the size the owner's stage index records for the whole file.
struct PeerCheck {
  uint32_t crc = 0;
  uint64_t file_size = 0;
};

// Called on the transport's progress thread for each request: for kServed, fills `bytes` with
// exactly the range's bytes (the whole file for kWhole) and `check`. Must not block for long (it
// reads a file of the local stage directory).
using PeerServe = std::function<PeerAnswer(const PeerRange& range, std::vector<std::byte>& bytes,
                                           PeerCheck& check)>;

struct TransportConfig {
  // The communicator to duplicate: the address of an MPI_Comm (C++; opaque here), else a Fortran
  // handle (mpi4py's Comm.py2f(), >= 0), else MPI_COMM_WORLD.
  const void* comm = nullptr;
  int64_t comm_fortran = -1;
  // The ranks given the same value form one node; -1: the ranks that share memory
  // (MPI_COMM_TYPE_SHARED). Tests emulate several nodes on one host with it.
  int64_t node_override = -1;
  uint64_t expect_rank = 0;        // the loader's rank and world size: a world that differs turns
  uint64_t expect_world_size = 1;  // the tier off (torchrun's processes are MPI worlds of one)
  uint64_t value = 0;              // gathered from every rank at start (values())
  PeerServe serve;
};

// How a request() ended.
enum class RequestEnd : uint32_t {
  kReply = 0,     // the peer answered (with bytes or without)
  kNoAnswer = 1,  // no answer within the timeout: the peer stalled or died (it answers "absent"
                  // before a requester's time runs out while it waits for a copy that is coming)
  kGone = 2,      // the peer said goodbye (its loader closed): it will answer no more
  kStopped = 3,   // this transport stopped
};

// Thread-safe: request() may be called from any number of threads at once; the MPI calls are made
// by the transport's one progress thread (and by the starting thread before it exists).
class Transport {
 public:
  virtual ~Transport() = default;  // stop()s
  virtual uint64_t rank() const = 0;
  virtual uint64_t world_size() const = 0;
  // Per rank: its node, named by the lowest rank on it.
  virtual const std::vector<uint64_t>& nodes() const = 0;
  // Per rank: the TransportConfig::value it started with.
  virtual const std::vector<uint64_t>& values() const = 0;
  // Asks rank `rank` for `range` and waits up to `timeout` for its answer: true with the bytes in
  // `bytes` and what to check them by in `check` (as the peer sent them: the caller checks), false
  // for an absent copy, a timeout, a peer that said goodbye (false at once from then on) or a
  // stopped transport; `end` (if given) says which. `held` (if given) gets the time of the request
  // that was the peer's doing, not the link's, so that the time of the transfer itself can be told
  // from it: how long the peer held its answer back (kLater: the copy was still being made), plus
  // the expected delay before the peer picked the request up (half its gap between looks for
  // requests; see set_quiet). An expectation: one request's `held` may exceed its whole time by up
  // to half that gap, and is unbiased over many.
  virtual bool request(uint64_t rank, const PeerRange& range, std::chrono::milliseconds timeout,
                       std::vector<std::byte>& bytes, PeerCheck& check, RequestEnd* end = nullptr,
                       std::chrono::microseconds* held = nullptr) = 0;
  // Quiet: this rank expects few requests from other ranks (its loader finds every link slower
  // than the source, so the other nodes, whose links are alike, read the source and only probe
  // this one). A transport that must poll for requests may then look for them less often, so that
  // an idle rank costs fewer wake-ups; it still polls as often as when not quiet while requests
  // of its own await replies. The requesters' estimates are not skewed by the later pickup: `held`
  // leaves it out. Off at start. Any thread; cheap when the value does not change.
  virtual void set_quiet(bool quiet) = 0;
  // Stops serving, answers the requests it was holding back (absent), says goodbye to every other
  // rank (their waits on this one end at once) and ends the waits under way (they return false);
  // returns promptly whatever the other ranks do (no collective call). Idempotent.
  virtual void stop() = 0;
};

// The plugin's one entry point, looked up by name: starts a transport (collective over the
// communicator: every rank of it calls this together), or returns null with the reason in `error`.
using TransportStart = Transport* (*)(const TransportConfig* config, std::string* error);
inline constexpr const char* kTransportStartSymbol = "prestage_transport_start";
inline constexpr const char* kTransportPlugin = "libprestage_mpi.so";

}  // namespace prestage::detail
