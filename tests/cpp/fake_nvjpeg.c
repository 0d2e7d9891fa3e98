/* A test double of nvJPEG (libnvjpeg): the entry points prestage's GPU decoder opens with dlsym. It
 * "decodes" with libjpeg-turbo on the host into the destination pointers (fake_cudart.c's device memory
 * is host memory), so the pixels are real.
 *
 * Behaves as nvJPEG where the decoder relies on it: the hardware backend cannot be created without an
 * engine (NVJPEG_STATUS_ARCH_MISMATCH); nvjpegDecodeBatchedSupported says a progressive JPEG is not
 * supported (as the hardware engine does); nvjpegGetImageInfo reports 4 components for CMYK and
 * NVJPEG_CSS_411 for 4:1:1; a batched decode must follow nvjpegDecodeBatchedInitialize with the same
 * count, on a state of the same handle, and fails (NVJPEG_STATUS_BAD_JPEG) if an image does not decode.
 *
 * Records: every handle, state and JPEG stream from creation to destruction (fake_nvjpeg_objects), each
 * batched decode's backend and size (fake_nvjpeg_batches). Controls: fake_nvjpeg_configure (hardware
 * engines; 0: none), fake_nvjpeg_fail (a named call fails on its n-th use), fake_nvjpeg_image_ns and
 * fake_nvjpeg_roi_image_ns (the virtual GPU time each image of a batched decode, whole or a region,
 * takes on its stream, in fake_cudart.c's clock), fake_nvjpeg_first_roi_ns (more at a state's first
 * nvjpegDecodeBatchedEx: a cold start). nvjpegDecodeBatchedEx decodes each image's region
 * (nvjpegDecodeParamsSetROI) and records it (fake_nvjpeg_rois).
 * Thread-safe: one mutex around all state. Built for the tests only; never installed. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <turbojpeg.h>

enum { kSuccess = 0, kInvalidParameter = 2, kBadJpeg = 3, kArchMismatch = 7 };
enum { kObjHandle = 0, kObjState = 1, kObjStream = 2, kObjParams = 3, kObjKinds = 4 };

struct handle { int backend; };
struct state { struct handle* owner; int initialized; int region_decodes; };
struct stream { int progressive, width, height; };
struct params { int format, x, y, width, height; }; /* width <= 0: no region, the whole image */
typedef struct { unsigned char* channel[4]; size_t pitch[4]; } image_t;

#define FAKE_MAX_OBJECTS 8192
#define FAKE_MAX_BATCHES 4096
static pthread_mutex_t mutex = PTHREAD_MUTEX_INITIALIZER;
static struct { int kind; void* pointer; } objects[FAKE_MAX_OBJECTS];
static size_t object_count;
static size_t created[kObjKinds], destroyed[kObjKinds], bad_destroys[kObjKinds];
static struct { int backend; int count; } batches[FAKE_MAX_BATCHES];
static size_t batch_count;
static unsigned engines = 0, cores = 1;
static uint64_t image_ns;     /* virtual GPU time per image of a batched decode */
static uint64_t roi_image_ns; /* the same, for an image of which only a region is decoded */
static uint64_t first_roi_ns; /* once more, at a state's first nvjpegDecodeBatchedEx: a cold start */
#define FAKE_MAX_ROIS 8192
static struct { int x, y, width, height; } rois[FAKE_MAX_ROIS];
static size_t roi_count;
static char fail_name[64];
static int fail_nth, fail_code, fail_seen;

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

static int live(int kind, const void* pointer) {
  for (size_t i = 0; i < object_count; ++i) {
    if (objects[i].kind == kind && objects[i].pointer == pointer) return 1;
  }
  return 0;
}

static int destroy(int kind, void* pointer, const char* name) {
  pthread_mutex_lock(&mutex);
  int result = failing(name) ? fail_code : kSuccess;
  if (result == kSuccess) {
    if (untrack(kind, pointer)) free(pointer);
    else result = kInvalidParameter;
  }
  pthread_mutex_unlock(&mutex);
  return result;
}

/* SOF2 (progressive) before the first SOS. */
static int is_progressive(const unsigned char* data, size_t length) {
  for (size_t i = 0; i + 1 < length; ++i) {
    if (data[i] != 0xFF) continue;
    if (data[i + 1] == 0xC2 || data[i + 1] == 0xC6 || data[i + 1] == 0xCA) return 1;
    if (data[i + 1] == 0xDA) return 0;
  }
  return 0;
}

/* Moves the CUDA runtime double's clock of `stream` (the copy already loaded, FAKE_CUDART_PATH). */
static void advance(void* stream, uint64_t ns) {
#ifndef FAKE_CUDART_PATH
  (void)stream; (void)ns;
#else
  if (ns == 0) return;
  void* cudart = dlopen(FAKE_CUDART_PATH, RTLD_NOW | RTLD_NOLOAD);
  if (cudart == NULL) return;
  void (*move)(void*, uint64_t) = (void (*)(void*, uint64_t))dlsym(cudart, "fake_cudart_advance");
  if (move != NULL) move(stream, ns);
  dlclose(cudart);
#endif
}

int nvjpegCreateEx(int backend, void* dev_allocator, void* pinned_allocator, unsigned flags,
                   struct handle** handle) {
  (void)dev_allocator; (void)pinned_allocator; (void)flags;
  pthread_mutex_lock(&mutex);
  int result = failing("nvjpegCreateEx") ? fail_code : kSuccess;
  if (result == kSuccess && backend == 3 && engines == 0) result = kArchMismatch;
  if (result == kSuccess) {
    *handle = calloc(1, sizeof(struct handle));
    (*handle)->backend = backend;
    track(kObjHandle, *handle);
  }
  pthread_mutex_unlock(&mutex);
  return result;
}

int nvjpegDestroy(struct handle* handle) { return destroy(kObjHandle, handle, "nvjpegDestroy"); }

int nvjpegGetHardwareDecoderInfo(struct handle* handle, unsigned* engines_out, unsigned* cores_out) {
  pthread_mutex_lock(&mutex);
  int result = live(kObjHandle, handle) ? kSuccess : kInvalidParameter;
  *engines_out = engines;
  *cores_out = cores;
  pthread_mutex_unlock(&mutex);
  return result;
}

/* An object of `kind` (`size` bytes, zeroed, tracked) made for a live `handle`; `name` is the call
   a test may make fail. */
static int create_for(struct handle* handle, int kind, size_t size, const char* name,
                      void** out) {
  pthread_mutex_lock(&mutex);
  int result = failing(name) ? fail_code : kSuccess;
  if (result == kSuccess && !live(kObjHandle, handle)) result = kInvalidParameter;
  if (result == kSuccess) {
    *out = calloc(1, size);
    track(kind, *out);
  }
  pthread_mutex_unlock(&mutex);
  return result;
}

int nvjpegJpegStateCreate(struct handle* handle, struct state** state) {
  void* made = NULL;
  const int result =
      create_for(handle, kObjState, sizeof(struct state), "nvjpegJpegStateCreate", &made);
  if (result == kSuccess) {
    *state = made;
    (*state)->owner = handle;
  }
  return result;
}

int nvjpegJpegStateDestroy(struct state* state) {
  return destroy(kObjState, state, "nvjpegJpegStateDestroy");
}

int nvjpegJpegStreamCreate(struct handle* handle, struct stream** stream) {
  void* made = NULL;
  const int result =
      create_for(handle, kObjStream, sizeof(struct stream), "nvjpegJpegStreamCreate", &made);
  if (result == kSuccess) *stream = made;
  return result;
}

int nvjpegJpegStreamDestroy(struct stream* stream) {
  return destroy(kObjStream, stream, "nvjpegJpegStreamDestroy");
}

int nvjpegGetImageInfo(struct handle* handle, const unsigned char* data, size_t length,
                       int* components, int* subsampling, int* widths, int* heights) {
  pthread_mutex_lock(&mutex);
  int result = failing("nvjpegGetImageInfo") ? fail_code : kSuccess;
  if (result == kSuccess && !live(kObjHandle, handle)) result = kInvalidParameter;
  pthread_mutex_unlock(&mutex);
  if (result != kSuccess) return result;
  tjhandle tj = tjInitDecompress();
  int width = 0, height = 0, samp = 0, colorspace = 0;
  if (tjDecompressHeader3(tj, data, (unsigned long)length, &width, &height, &samp, &colorspace) != 0) {
    tjDestroy(tj);
    return kBadJpeg;
  }
  tjDestroy(tj);
  static const int css[] = {0 /*444*/, 1 /*422*/, 2 /*420*/, 6 /*gray*/, 3 /*440*/, 4 /*411*/};
  *subsampling = samp >= 0 && samp < 6 ? css[samp] : -1;
  *components = colorspace == TJCS_CMYK || colorspace == TJCS_YCCK ? 4 : samp == TJSAMP_GRAY ? 1 : 3;
  for (int c = 0; c < 4; ++c) widths[c] = heights[c] = 0;
  widths[0] = width;
  heights[0] = height;
  return kSuccess;
}

int nvjpegJpegStreamParse(struct handle* handle, const unsigned char* data, size_t length,
                          int save_metadata, int save_stream, struct stream* stream) {
  (void)save_metadata; (void)save_stream;
  pthread_mutex_lock(&mutex);
  int result = failing("nvjpegJpegStreamParse") ? fail_code : kSuccess;
  if (result == kSuccess && (!live(kObjHandle, handle) || !live(kObjStream, stream))) {
    result = kInvalidParameter;
  }
  if (result == kSuccess) stream->progressive = is_progressive(data, length);
  pthread_mutex_unlock(&mutex);
  if (result == kSuccess) {
    tjhandle tj = tjInitDecompress();
    int samp = 0, colorspace = 0;
    if (tjDecompressHeader3(tj, data, (unsigned long)length, &stream->width, &stream->height, &samp,
                            &colorspace) != 0) {
      stream->width = stream->height = 0;
    }
    tjDestroy(tj);
  }
  return result;
}

int nvjpegDecodeParamsCreate(struct handle* handle, struct params** params) {
  void* made = NULL;
  const int result =
      create_for(handle, kObjParams, sizeof(struct params), "nvjpegDecodeParamsCreate", &made);
  if (result == kSuccess) *params = made;
  return result;
}

int nvjpegDecodeParamsDestroy(struct params* params) {
  return destroy(kObjParams, params, "nvjpegDecodeParamsDestroy");
}

int nvjpegDecodeParamsSetOutputFormat(struct params* params, int format) {
  pthread_mutex_lock(&mutex);
  int result = live(kObjParams, params) ? kSuccess : kInvalidParameter;
  if (result == kSuccess) params->format = format;
  pthread_mutex_unlock(&mutex);
  return result;
}

/* As nvJPEG: a width or height of -1 (with offsets 0) is the whole image. */
int nvjpegDecodeParamsSetROI(struct params* params, int x, int y, int width, int height) {
  pthread_mutex_lock(&mutex);
  int result = failing("nvjpegDecodeParamsSetROI") ? fail_code : kSuccess;
  if (result == kSuccess && !live(kObjParams, params)) result = kInvalidParameter;
  if (result == kSuccess) {
    params->x = x;
    params->y = y;
    params->width = width;
    params->height = height;
  }
  pthread_mutex_unlock(&mutex);
  return result;
}

/* Declines what nvjpegDecodeBatchedSupported declines, and a region outside the image. */
int nvjpegDecodeBatchedSupportedEx(struct handle* handle, struct stream* stream,
                                   struct params* params, int* unsupported) {
  pthread_mutex_lock(&mutex);
  int result = live(kObjHandle, handle) && live(kObjStream, stream) && live(kObjParams, params)
                   ? kSuccess : kInvalidParameter;
  if (result == kSuccess) {
    const int outside = params->width > 0 &&
                        (params->x < 0 || params->y < 0 || params->x + params->width > stream->width ||
                         params->y + params->height > stream->height);
    *unsupported = (handle->backend == 3 && stream->progressive) || outside ? 1 : 0;
  }
  pthread_mutex_unlock(&mutex);
  return result;
}

int nvjpegDecodeBatchedSupported(struct handle* handle, struct stream* stream, int* unsupported) {
  pthread_mutex_lock(&mutex);
  int result = live(kObjHandle, handle) && live(kObjStream, stream) ? kSuccess : kInvalidParameter;
  if (result == kSuccess) *unsupported = handle->backend == 3 && stream->progressive ? 1 : 0;
  pthread_mutex_unlock(&mutex);
  return result;
}

int nvjpegDecodeBatchedPreAllocate(struct handle* handle, struct state* state, int batch_size,
                                   int width, int height, int css, int format) {
  (void)batch_size; (void)width; (void)height; (void)css; (void)format;
  pthread_mutex_lock(&mutex);
  int result = failing("nvjpegDecodeBatchedPreAllocate") ? fail_code : kSuccess;
  if (result == kSuccess &&
      (!live(kObjHandle, handle) || !live(kObjState, state) || handle->backend != 3)) {
    result = kInvalidParameter;
  }
  pthread_mutex_unlock(&mutex);
  return result;
}

int nvjpegDecodeBatchedInitialize(struct handle* handle, struct state* state, int batch_size,
                                  int max_cpu_threads, int format) {
  (void)max_cpu_threads;
  pthread_mutex_lock(&mutex);
  int result = failing("nvjpegDecodeBatchedInitialize") ? fail_code : kSuccess;
  if (result == kSuccess && (!live(kObjHandle, handle) || !live(kObjState, state) ||
                             state->owner != handle || batch_size <= 0 || format != 5)) {
    result = kInvalidParameter;
  }
  if (result == kSuccess) state->initialized = batch_size;
  pthread_mutex_unlock(&mutex);
  return result;
}

int nvjpegDecodeBatched(struct handle* handle, struct state* state, const unsigned char* const* data,
                        const size_t* lengths, image_t* destinations, void* stream) {
  pthread_mutex_lock(&mutex);
  int result = failing("nvjpegDecodeBatched") ? fail_code : kSuccess;
  if (result == kSuccess && (!live(kObjHandle, handle) || !live(kObjState, state) ||
                             state->owner != handle || state->initialized <= 0 || stream == NULL)) {
    result = kInvalidParameter;
  }
  int n = result == kSuccess ? state->initialized : 0;
  if (result == kSuccess && batch_count < FAKE_MAX_BATCHES) {
    batches[batch_count].backend = handle->backend;
    batches[batch_count].count = n;
    ++batch_count;
  }
  pthread_mutex_unlock(&mutex);
  if (result != kSuccess) return result;
  tjhandle tj = tjInitDecompress();
  for (int i = 0; i < n && result == kSuccess; ++i) {
    int width = 0, height = 0, samp = 0, colorspace = 0;
    if (tjDecompressHeader3(tj, data[i], (unsigned long)lengths[i], &width, &height, &samp,
                            &colorspace) != 0 ||
        tjDecompress2(tj, data[i], (unsigned long)lengths[i], destinations[i].channel[0], width,
                      (int)destinations[i].pitch[0], height, TJPF_RGB, 0) != 0) {
      result = kBadJpeg;
    }
  }
  tjDestroy(tj);
  if (result == kSuccess) advance(stream, image_ns * (uint64_t)n);
  return result;
}

/* As nvjpegDecodeBatched, each image decoded into its destination as its parameters say: only its
 * region (rows of the region's width at the destination's pitch), or whole; in RGBI only. */
int nvjpegDecodeBatchedEx(struct handle* handle, struct state* state, const unsigned char* const* data,
                          const size_t* lengths, image_t* destinations, struct params** params,
                          void* stream) {
  pthread_mutex_lock(&mutex);
  int result = failing("nvjpegDecodeBatchedEx") ? fail_code : kSuccess;
  if (result == kSuccess && (!live(kObjHandle, handle) || !live(kObjState, state) ||
                             state->owner != handle || state->initialized <= 0 || stream == NULL)) {
    result = kInvalidParameter;
  }
  int n = result == kSuccess ? state->initialized : 0;
  for (int i = 0; i < n && result == kSuccess; ++i) {
    if (!live(kObjParams, params[i]) || params[i]->format != 5) result = kInvalidParameter;
  }
  const uint64_t cold_ns = result == kSuccess && state->region_decodes++ == 0 ? first_roi_ns : 0;
  if (result == kSuccess && batch_count < FAKE_MAX_BATCHES) {
    batches[batch_count].backend = handle->backend;
    batches[batch_count].count = n;
    ++batch_count;
  }
  pthread_mutex_unlock(&mutex);
  if (result != kSuccess) return result;
  tjhandle tj = tjInitDecompress();
  uint64_t virtual_ns = cold_ns;
  for (int i = 0; i < n && result == kSuccess; ++i) {
    int width = 0, height = 0, samp = 0, colorspace = 0;
    if (tjDecompressHeader3(tj, data[i], (unsigned long)lengths[i], &width, &height, &samp,
                            &colorspace) != 0) {
      result = kBadJpeg;
      break;
    }
    pthread_mutex_lock(&mutex);
    struct params region = *params[i];
    pthread_mutex_unlock(&mutex);
    if (region.width <= 0 || region.height <= 0) {
      region.x = region.y = 0;
      region.width = width;
      region.height = height;
    }
    if (region.x < 0 || region.y < 0 || region.x + region.width > width ||
        region.y + region.height > height) {
      result = kInvalidParameter;
      break;
    }
    unsigned char* whole = malloc((size_t)width * height * 3);
    if (whole == NULL ||
        tjDecompress2(tj, data[i], (unsigned long)lengths[i], whole, width, width * 3, height,
                      TJPF_RGB, 0) != 0) {
      result = kBadJpeg;
    } else {
      for (int y = 0; y < region.height; ++y) {
        memcpy(destinations[i].channel[0] + (size_t)y * destinations[i].pitch[0],
               whole + ((size_t)(region.y + y) * width + region.x) * 3, (size_t)region.width * 3);
      }
      const int cropped = region.width != width || region.height != height;
      virtual_ns += cropped ? roi_image_ns : image_ns;
      pthread_mutex_lock(&mutex);
      if (roi_count < FAKE_MAX_ROIS) {
        rois[roi_count].x = region.x;
        rois[roi_count].y = region.y;
        rois[roi_count].width = region.width;
        rois[roi_count].height = region.height;
        ++roi_count;
      }
      pthread_mutex_unlock(&mutex);
    }
    free(whole);
  }
  tjDestroy(tj);
  if (result == kSuccess) advance(stream, virtual_ns);
  return result;
}

/* --- controls for the tests --- */

static void set_ns(uint64_t* to, uint64_t ns) {
  pthread_mutex_lock(&mutex);
  *to = ns;
  pthread_mutex_unlock(&mutex);
}

/* Each image of a batched decode takes `ns` of the stream's virtual time (fake_cudart.c's clock,
 * which cudaEventElapsedTime measures); 0, the default: none. */
void fake_nvjpeg_image_ns(uint64_t ns) { set_ns(&image_ns, ns); }

/* The same for an image of which nvjpegDecodeBatchedEx decodes only a region. */
void fake_nvjpeg_roi_image_ns(uint64_t ns) { set_ns(&roi_image_ns, ns); }

/* A state's first nvjpegDecodeBatchedEx takes `ns` more of the stream's virtual time. */
void fake_nvjpeg_first_roi_ns(uint64_t ns) { set_ns(&first_roi_ns, ns); }

/* Copies up to `max` regions (x, y, width, height) decoded by nvjpegDecodeBatchedEx since configure;
 * returns how many. */
size_t fake_nvjpeg_rois(int* out, size_t max) {
  pthread_mutex_lock(&mutex);
  size_t n = roi_count;
  for (size_t i = 0; i < n && i < max; ++i) {
    out[4 * i] = rois[i].x;
    out[4 * i + 1] = rois[i].y;
    out[4 * i + 2] = rois[i].width;
    out[4 * i + 3] = rois[i].height;
  }
  pthread_mutex_unlock(&mutex);
  return n;
}

/* Hardware engines (0: none, the hardware backend cannot be created) and cores per engine; forgets the
 * batches recorded. */
void fake_nvjpeg_configure(unsigned engine_count, unsigned cores_per_engine) {
  pthread_mutex_lock(&mutex);
  engines = engine_count;
  cores = cores_per_engine;
  batch_count = 0;
  roi_count = 0;
  pthread_mutex_unlock(&mutex);
}

/* The `nth` call (from now, 1-based) of `name` returns `status`; nth 0: none fails. */
void fake_nvjpeg_fail(const char* name, int nth, int status) {
  pthread_mutex_lock(&mutex);
  snprintf(fail_name, sizeof fail_name, "%s", name);
  fail_nth = nth;
  fail_code = status;
  fail_seen = 0;
  pthread_mutex_unlock(&mutex);
}

/* Objects of `kind` (0 handles, 1 states, 2 JPEG streams, 3 decode parameters): created, destroyed,
 * bad destructions. */
void fake_nvjpeg_objects(int kind, size_t out[3]) {
  pthread_mutex_lock(&mutex);
  out[0] = created[kind];
  out[1] = destroyed[kind];
  out[2] = bad_destroys[kind];
  pthread_mutex_unlock(&mutex);
}

/* Copies up to `max` (backend, count) pairs of the batched decodes since configure; returns how many. */
size_t fake_nvjpeg_batches(int* out, size_t max) {
  pthread_mutex_lock(&mutex);
  size_t n = batch_count;
  for (size_t i = 0; i < n && i < max; ++i) {
    out[2 * i] = batches[i].backend;
    out[2 * i + 1] = batches[i].count;
  }
  pthread_mutex_unlock(&mutex);
  return n;
}
