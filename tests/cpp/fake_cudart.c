/* A test double of the CUDA runtime library (libcudart): the entry points prestage opens with dlsym,
 * recording each call (operation, pointer, size, the calling thread's device, result) in order.
 *
 * Behaves as the real runtime where prestage relies on it: a range cannot be registered twice
 * (cudaErrorHostMemoryAlreadyRegistered), only a registered pointer can be unregistered
 * (cudaErrorHostMemoryNotRegistered), and the memory is read at both calls, so that a range freed before
 * its unregistration is reported (a fault, or AddressSanitizer's use-after-free).
 *
 * Controls: fake_cudart_configure() and fake_cudart_calls() (for tests that dlopen this library), or, read
 * when it is loaded, the environment: FAKE_CUDART_DEVICES (default 1), FAKE_CUDART_COUNT_ERROR and
 * FAKE_CUDART_REGISTER_ERROR (a cudaError_t to return; default 0), and FAKE_CUDART_LOG (a file to which
 * each call is appended as one line: "<op> <pointer> <size> <device> <result>").
 * Device memory, streams and events (for the GPU decoder): "device" memory is host memory (so the doubles
 * of nvJPEG and NPP can write pixels the tests read back), copies are synchronous, streams and events are
 * tokens with a virtual clock that only fake_cudart_advance moves (cudaEventElapsedTime measures it;
 * fake_cudart_not_ready makes it answer "not ready"); each object is tracked from its creation to its
 * destruction (fake_cudart_objects), and a named call can be made to fail on its n-th use
 * (fake_cudart_fail).
 * Thread-safe: one mutex around all state. Built for the tests only; never installed. */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { kSuccess = 0, kInvalidValue = 1, kInvalidDevice = 101, kAlreadyRegistered = 712,
       kNotRegistered = 713 };
enum { kCount = 1, kRegister = 2, kUnregister = 3, kSetDevice = 4 };

struct fake_cudart_call {
  int op;
  uintptr_t pointer;
  size_t size;
  int device; /* the calling thread's current device */
  unsigned flags;
  int result;
};

#define FAKE_MAX_CALLS 4096
#define FAKE_MAX_RANGES 1024

static pthread_mutex_t mutex = PTHREAD_MUTEX_INITIALIZER;
static struct fake_cudart_call calls[FAKE_MAX_CALLS];
static size_t call_count;
static struct { uintptr_t pointer; size_t size; } ranges[FAKE_MAX_RANGES];
static size_t range_count;
static int devices = 1, count_error, register_error;
static FILE* log_file;
static __thread int current_device;

static int env_int(const char* name, int fallback) {
  const char* text = getenv(name);
  return text != NULL && *text != '\0' ? atoi(text) : fallback;
}

__attribute__((constructor)) static void load(void) {
  devices = env_int("FAKE_CUDART_DEVICES", 1);
  count_error = env_int("FAKE_CUDART_COUNT_ERROR", 0);
  register_error = env_int("FAKE_CUDART_REGISTER_ERROR", 0);
  const char* path = getenv("FAKE_CUDART_LOG");
  if (path != NULL && *path != '\0') log_file = fopen(path, "a");
}

/* Under the mutex. */
static int record(int op, const void* pointer, size_t size, unsigned flags, int result) {
  if (call_count < FAKE_MAX_CALLS) {
    struct fake_cudart_call c = {op, (uintptr_t)pointer, size, current_device, flags, result};
    calls[call_count++] = c;
  }
  if (log_file != NULL) {
    static const char* const names[] = {"?", "count", "register", "unregister", "set_device"};
    fprintf(log_file, "%s %#lx %zu %d %d\n", names[op], (unsigned long)(uintptr_t)pointer, size,
            current_device, result);
    fflush(log_file);
  }
  return result;
}

static void touch(const void* pointer, size_t size) {
  const volatile unsigned char* bytes = (const volatile unsigned char*)pointer;
  (void)bytes[0];
  (void)bytes[size - 1];
}

/* --- the runtime's entry points (cudaError_t is an int) --- */

int cudaGetDeviceCount(int* count) {
  pthread_mutex_lock(&mutex);
  int result = count_error;
  if (result == kSuccess) *count = devices;
  record(kCount, NULL, (size_t)devices, 0, result);
  pthread_mutex_unlock(&mutex);
  return result;
}

int cudaGetDevice(int* device) {
  *device = current_device;
  return kSuccess;
}

int cudaSetDevice(int device) {
  pthread_mutex_lock(&mutex);
  int result = device >= 0 && device < devices ? kSuccess : kInvalidDevice;
  if (result == kSuccess) current_device = device;
  record(kSetDevice, NULL, (size_t)device, 0, result);
  pthread_mutex_unlock(&mutex);
  return result;
}

int cudaHostRegister(void* pointer, size_t size, unsigned flags) {
  pthread_mutex_lock(&mutex);
  int result = register_error;
  if (pointer == NULL || size == 0) result = kInvalidValue;
  for (size_t i = 0; result == kSuccess && i < range_count; ++i) {
    uintptr_t begin = (uintptr_t)pointer;
    if (begin < ranges[i].pointer + ranges[i].size && ranges[i].pointer < begin + size) {
      result = kAlreadyRegistered;
    }
  }
  if (result == kSuccess && range_count == FAKE_MAX_RANGES) result = kInvalidValue;
  if (result == kSuccess) {
    touch(pointer, size);
    ranges[range_count].pointer = (uintptr_t)pointer;
    ranges[range_count].size = size;
    ++range_count;
  }
  record(kRegister, pointer, size, flags, result);
  pthread_mutex_unlock(&mutex);
  return result;
}

int cudaHostUnregister(void* pointer) {
  pthread_mutex_lock(&mutex);
  int result = kNotRegistered;
  size_t size = 0;
  for (size_t i = 0; i < range_count; ++i) {
    if (ranges[i].pointer == (uintptr_t)pointer) {
      size = ranges[i].size;
      touch(pointer, size);
      ranges[i] = ranges[--range_count];
      result = kSuccess;
      break;
    }
  }
  record(kUnregister, pointer, size, 0, result);
  pthread_mutex_unlock(&mutex);
  return result;
}

const char* cudaGetErrorString(int error) {
  switch (error) {
    case kSuccess: return "no error";
    case kInvalidValue: return "invalid argument";
    case kInvalidDevice: return "invalid device ordinal";
    case kAlreadyRegistered: return "part or all of the requested memory range is already mapped";
    case kNotRegistered: return "pointer does not correspond to a registered memory region";
    default: return "unrecognized error code";
  }
}

/* --- controls for the tests --- */

/* Sets the behaviour and forgets the calls recorded (not the ranges registered). */
void fake_cudart_configure(int device_count, int count_error_code, int register_error_code) {
  pthread_mutex_lock(&mutex);
  devices = device_count;
  count_error = count_error_code;
  register_error = register_error_code;
  call_count = 0;
  pthread_mutex_unlock(&mutex);
}

/* Copies up to `max` recorded calls, in order, into `out`; returns how many were recorded. */
size_t fake_cudart_calls(struct fake_cudart_call* out, size_t max) {
  pthread_mutex_lock(&mutex);
  size_t n = call_count;
  for (size_t i = 0; i < n && i < max; ++i) out[i] = calls[i];
  pthread_mutex_unlock(&mutex);
  return n;
}

/* Ranges registered now. */
size_t fake_cudart_registered(void) {
  pthread_mutex_lock(&mutex);
  size_t n = range_count;
  pthread_mutex_unlock(&mutex);
  return n;
}

/* --- device memory, streams and events --- */

enum { kObjDevice = 0, kObjHost = 1, kObjStream = 2, kObjEvent = 3, kObjKinds = 4 };
enum { kErrorMemoryAllocation = 2, kErrorInvalidResourceHandle = 400 };
#define FAKE_MAX_OBJECTS 4096
static struct { int kind; void* pointer; } objects[FAKE_MAX_OBJECTS];
static size_t object_count;
static size_t created[kObjKinds], destroyed[kObjKinds], bad_destroys[kObjKinds];
static char fail_name[64];
static int fail_nth, fail_code, fail_seen;

/* Under the mutex: whether this call of `name` is the one made to fail. */
static int failing(const char* name) {
  if (fail_nth <= 0 || strcmp(name, fail_name) != 0) return 0;
  return ++fail_seen == fail_nth;
}

static void track(int kind, void* pointer) {
  if (object_count < FAKE_MAX_OBJECTS) {
    objects[object_count].kind = kind;
    objects[object_count].pointer = pointer;
    ++object_count;
  }
  ++created[kind];
}

static int untrack(int kind, void* pointer) {
  for (size_t i = 0; i < object_count; ++i) {
    if (objects[i].kind == kind && objects[i].pointer == pointer) {
      objects[i] = objects[--object_count];
      ++destroyed[kind];
      return 1;
    }
  }
  ++bad_destroys[kind];
  return 0;
}

static int make(int kind, void** out, size_t size, const char* name) {
  pthread_mutex_lock(&mutex);
  int result = failing(name) ? fail_code : kSuccess;
  if (result == kSuccess) {
    *out = malloc(size > 0 ? size : 1);
    if (*out == NULL) result = kErrorMemoryAllocation;
    else track(kind, *out);
  }
  pthread_mutex_unlock(&mutex);
  return result;
}

static int unmake(int kind, void* pointer, const char* name) {
  pthread_mutex_lock(&mutex);
  int result = failing(name) ? fail_code : kSuccess;
  if (result == kSuccess) {
    if (untrack(kind, pointer)) free(pointer);
    else result = kErrorInvalidResourceHandle;
  }
  pthread_mutex_unlock(&mutex);
  return result;
}

static int live(int kind, void* pointer) {
  for (size_t i = 0; i < object_count; ++i) {
    if (objects[i].kind == kind && objects[i].pointer == pointer) return 1;
  }
  return 0;
}

static int use(int kind, void* pointer, const char* name) {
  pthread_mutex_lock(&mutex);
  int result = failing(name) ? fail_code : kSuccess;
  if (result == kSuccess && pointer != NULL && !live(kind, pointer)) result = kErrorInvalidResourceHandle;
  pthread_mutex_unlock(&mutex);
  return result;
}

int cudaDeviceGetAttribute(int* value, int attribute, int device) {
  (void)device;
  pthread_mutex_lock(&mutex);
  int result = failing("cudaDeviceGetAttribute") ? fail_code : kSuccess;
  pthread_mutex_unlock(&mutex);
  *value = attribute == 75 ? 9 : attribute == 8 ? 49152 : attribute == 16 ? 132 : 1024;
  return result;
}

int cudaMalloc(void** pointer, size_t size) { return make(kObjDevice, pointer, size, "cudaMalloc"); }
int cudaFree(void* pointer) { return unmake(kObjDevice, pointer, "cudaFree"); }
int cudaHostAlloc(void** pointer, size_t size, unsigned flags) {
  (void)flags;
  return make(kObjHost, pointer, size, "cudaHostAlloc");
}
int cudaFreeHost(void* pointer) { return unmake(kObjHost, pointer, "cudaFreeHost"); }
/* A stream's block holds its virtual clock (ns); an event's, the clock it was recorded at, whether
 * it was, and its flags. */
struct fake_stream { uint64_t clock_ns; };
struct fake_event { uint64_t at_ns; unsigned flags; int recorded; };

int cudaStreamCreateWithFlags(void** stream, unsigned flags) {
  (void)flags;
  int result = make(kObjStream, stream, sizeof(struct fake_stream), "cudaStreamCreateWithFlags");
  if (result == kSuccess) ((struct fake_stream*)*stream)->clock_ns = 0;
  return result;
}
int cudaStreamDestroy(void* stream) { return unmake(kObjStream, stream, "cudaStreamDestroy"); }
int cudaStreamSynchronize(void* stream) { return use(kObjStream, stream, "cudaStreamSynchronize"); }
int cudaEventCreateWithFlags(void** event, unsigned flags) {
  int result = make(kObjEvent, event, sizeof(struct fake_event), "cudaEventCreateWithFlags");
  if (result == kSuccess) {
    struct fake_event* e = *event;
    e->at_ns = 0;
    e->flags = flags;
    e->recorded = 0;
  }
  return result;
}
int cudaEventDestroy(void* event) { return unmake(kObjEvent, event, "cudaEventDestroy"); }
int cudaEventSynchronize(void* event) { return use(kObjEvent, event, "cudaEventSynchronize"); }
int cudaEventRecord(void* event, void* stream) {
  int result = use(kObjStream, stream, "cudaEventRecord");
  if (result == kSuccess) result = use(kObjEvent, event, "");
  if (result == kSuccess && stream != NULL) {
    pthread_mutex_lock(&mutex);
    struct fake_event* e = event;
    e->at_ns = ((struct fake_stream*)stream)->clock_ns;
    e->recorded = 1;
    pthread_mutex_unlock(&mutex);
  }
  return result;
}

enum { kErrorNotReady = 600 };
static int not_ready; /* cudaEventElapsedTime calls still to answer cudaErrorNotReady */

/* The virtual time between two records: a stream's clock moves only by fake_cudart_advance (the
 * nvJPEG double's per-image time), so GPU timings are exact and cost no wall time. As the runtime:
 * events without timing (cudaEventDisableTiming) or never recorded are refused. */
int cudaEventElapsedTime(float* ms, void* start, void* end) {
  pthread_mutex_lock(&mutex);
  int result = failing("cudaEventElapsedTime") ? fail_code : kSuccess;
  if (result == kSuccess && (!live(kObjEvent, start) || !live(kObjEvent, end))) {
    result = kErrorInvalidResourceHandle;
  }
  if (result == kSuccess) {
    const struct fake_event* a = start;
    const struct fake_event* b = end;
    if ((a->flags & 0x02) != 0 || (b->flags & 0x02) != 0 || !a->recorded || !b->recorded) {
      result = kErrorInvalidResourceHandle;
    } else if (not_ready > 0) {
      --not_ready;
      result = kErrorNotReady;
    } else {
      *ms = (float)((double)(b->at_ns - a->at_ns) / 1e6);
    }
  }
  pthread_mutex_unlock(&mutex);
  return result;
}

/* Advances `stream`'s virtual clock by `ns` (work queued on it that takes that long). */
void fake_cudart_advance(void* stream, uint64_t ns) {
  pthread_mutex_lock(&mutex);
  if (live(kObjStream, stream)) ((struct fake_stream*)stream)->clock_ns += ns;
  pthread_mutex_unlock(&mutex);
}

/* The next `calls` cudaEventElapsedTime calls answer cudaErrorNotReady (work still running). */
void fake_cudart_not_ready(int calls) {
  pthread_mutex_lock(&mutex);
  not_ready = calls;
  pthread_mutex_unlock(&mutex);
}
int cudaMemcpyAsync(void* dst, const void* src, size_t size, int kind, void* stream) {
  (void)kind;
  int result = use(kObjStream, stream, "cudaMemcpyAsync");
  if (result == kSuccess) memcpy(dst, src, size);
  return result;
}

/* Objects of `kind` (0 device memory, 1 pinned host memory, 2 streams, 3 events): out[0] created,
 * out[1] destroyed, out[2] destructions of one never created or already destroyed. */
void fake_cudart_objects(int kind, size_t out[3]) {
  pthread_mutex_lock(&mutex);
  out[0] = created[kind];
  out[1] = destroyed[kind];
  out[2] = bad_destroys[kind];
  pthread_mutex_unlock(&mutex);
}

/* The `nth` call (from now, 1-based) of the entry point `name` returns `code`; nth 0: none fails. */
void fake_cudart_fail(const char* name, int nth, int code) {
  pthread_mutex_lock(&mutex);
  snprintf(fail_name, sizeof fail_name, "%s", name);
  fail_nth = nth;
  fail_code = code;
  fail_seen = 0;
  pthread_mutex_unlock(&mutex);
}
