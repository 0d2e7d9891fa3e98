/* A test double of NPP's image geometry library (libnppig): nppiResize_8u_C3R_Ctx and
 * nppiMirror_8u_C3R_Ctx on host memory (fake_cudart.c's device memory is host memory). The resize
 * averages the source pixels each output pixel covers (as NPPI_INTER_SUPER) when it shrinks, and is
 * bilinear otherwise: close to, not equal to, the CPU path's antialiased bilinear filter.
 *
 * Refuses (NPP_SIZE_ERROR) a source ROI outside the source and a step smaller than a row, as NPP does.
 * nppiResizeBatch_8u_C3R_Advanced_Ctx resizes each image of its arrays as the single call does.
 * Records each resize (source ROI, destination size, interpolation, stream), batched or not, and
 * counts batched calls and mirrors.
 * Controls: fake_npp_fail (a named call fails on its n-th use); fake_npp_resizes, fake_npp_batches,
 * fake_npp_mirrors.
 * Thread-safe: one mutex around all state. Built for the tests only; never installed. */
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

typedef struct { int width, height; } size2;
typedef struct { int x, y, width, height; } rect;
typedef struct {
  void* stream;
  int device_id, multiprocessors, threads_per_multiprocessor, threads_per_block;
  size_t shared_per_block;
  int major, minor;
  unsigned stream_flags;
  int reserved0;
} context;

enum { kSuccess = 0, kSizeError = -6, kStepError = -14, kNullPointerError = -8 };

struct resize_record { int x, y, width, height, dst_width, dst_height, interpolation; void* stream; };

#define FAKE_MAX_RESIZES 8192
static pthread_mutex_t mutex = PTHREAD_MUTEX_INITIALIZER;
static struct resize_record resizes[FAKE_MAX_RESIZES];
static size_t resize_count, mirror_count, batch_count;
static char fail_name[64];
static int fail_nth, fail_code, fail_seen;

static int failing(const char* name) {
  if (fail_nth <= 0 || strcmp(name, fail_name) != 0) return 0;
  return ++fail_seen == fail_nth;
}

static void record(rect src_roi, rect dst_roi, int interpolation, void* stream) {
  if (resize_count < FAKE_MAX_RESIZES) {
    struct resize_record r = {src_roi.x, src_roi.y, src_roi.width, src_roi.height,
                              dst_roi.width, dst_roi.height, interpolation, stream};
    resizes[resize_count++] = r;
  }
}

static int resize_pixels(const unsigned char* src, int src_step, size2 src_size, rect src_roi,
                         unsigned char* dst, int dst_step, size2 dst_size, rect dst_roi,
                         context ctx) {
  if (src == NULL || dst == NULL || ctx.stream == NULL) return kNullPointerError;
  if (src_roi.x < 0 || src_roi.y < 0 || src_roi.width <= 0 || src_roi.height <= 0 ||
      src_roi.x + src_roi.width > src_size.width || src_roi.y + src_roi.height > src_size.height ||
      dst_roi.x != 0 || dst_roi.y != 0 || dst_roi.width != dst_size.width ||
      dst_roi.height != dst_size.height || dst_size.width <= 0 || dst_size.height <= 0) {
    return kSizeError;
  }
  if (src_step < src_size.width * 3 || dst_step < dst_size.width * 3) return kStepError;
  const double sx = (double)src_roi.width / dst_size.width;
  const double sy = (double)src_roi.height / dst_size.height;
  for (int y = 0; y < dst_size.height; ++y) {
    for (int x = 0; x < dst_size.width; ++x) {
      unsigned char* out = dst + (size_t)y * dst_step + (size_t)x * 3;
      if (sx > 1.0 && sy > 1.0) {
        int x0 = src_roi.x + (int)(x * sx), x1 = src_roi.x + (int)((x + 1) * sx + 0.999999);
        int y0 = src_roi.y + (int)(y * sy), y1 = src_roi.y + (int)((y + 1) * sy + 0.999999);
        if (x1 > src_roi.x + src_roi.width) x1 = src_roi.x + src_roi.width;
        if (y1 > src_roi.y + src_roi.height) y1 = src_roi.y + src_roi.height;
        for (int c = 0; c < 3; ++c) {
          double sum = 0;
          for (int yy = y0; yy < y1; ++yy) {
            for (int xx = x0; xx < x1; ++xx) sum += src[(size_t)yy * src_step + (size_t)xx * 3 + c];
          }
          out[c] = (unsigned char)(sum / ((x1 - x0) * (y1 - y0)) + 0.5);
        }
      } else {
        double fx = src_roi.x + (x + 0.5) * sx - 0.5, fy = src_roi.y + (y + 0.5) * sy - 0.5;
        if (fx < src_roi.x) fx = src_roi.x;
        if (fy < src_roi.y) fy = src_roi.y;
        if (fx > src_roi.x + src_roi.width - 1) fx = src_roi.x + src_roi.width - 1;
        if (fy > src_roi.y + src_roi.height - 1) fy = src_roi.y + src_roi.height - 1;
        int ix = (int)fx, iy = (int)fy;
        int jx = ix + 1 < src_roi.x + src_roi.width ? ix + 1 : ix;
        int jy = iy + 1 < src_roi.y + src_roi.height ? iy + 1 : iy;
        double ax = fx - ix, ay = fy - iy;
        for (int c = 0; c < 3; ++c) {
          double p00 = src[(size_t)iy * src_step + (size_t)ix * 3 + c];
          double p01 = src[(size_t)iy * src_step + (size_t)jx * 3 + c];
          double p10 = src[(size_t)jy * src_step + (size_t)ix * 3 + c];
          double p11 = src[(size_t)jy * src_step + (size_t)jx * 3 + c];
          double v = (1 - ay) * ((1 - ax) * p00 + ax * p01) + ay * ((1 - ax) * p10 + ax * p11);
          out[c] = (unsigned char)(v + 0.5);
        }
      }
    }
  }
  return kSuccess;
}

int nppiResize_8u_C3R_Ctx(const unsigned char* src, int src_step, size2 src_size, rect src_roi,
                          unsigned char* dst, int dst_step, size2 dst_size, rect dst_roi,
                          int interpolation, context ctx) {
  pthread_mutex_lock(&mutex);
  int result = failing("nppiResize_8u_C3R_Ctx") ? fail_code : kSuccess;
  if (result == kSuccess) record(src_roi, dst_roi, interpolation, ctx.stream);
  pthread_mutex_unlock(&mutex);
  if (result != kSuccess) return result;
  return resize_pixels(src, src_step, src_size, src_roi, dst, dst_step, dst_size, dst_roi, ctx);
}

/* NppiImageDescriptor and NppiResizeBatchROI_Advanced. */
typedef struct { void* data; int step; size2 size; } image_descriptor;
typedef struct { rect src, dst; } batch_roi;

/* The arrays are read where the caller put them (fake_cudart's device memory is host memory), so
 * they hold the caller's values only once its copy to the device was made. */
int nppiResizeBatch_8u_C3R_Advanced_Ctx(int max_width, int max_height, image_descriptor* sources,
                                        image_descriptor* destinations, batch_roi* rois,
                                        unsigned count, int interpolation, context ctx) {
  pthread_mutex_lock(&mutex);
  int result = failing("nppiResizeBatch_8u_C3R_Advanced_Ctx") ? fail_code : kSuccess;
  if (result == kSuccess) {
    ++batch_count;
    for (unsigned i = 0; i < count && rois != NULL; ++i) {
      record(rois[i].src, rois[i].dst, interpolation, ctx.stream);
    }
  }
  pthread_mutex_unlock(&mutex);
  if (result != kSuccess) return result;
  if (sources == NULL || destinations == NULL || rois == NULL) return kNullPointerError;
  if (count == 0) return kSizeError;
  for (unsigned i = 0; i < count; ++i) {
    if (rois[i].dst.width > max_width || rois[i].dst.height > max_height) return kSizeError;
    int status = resize_pixels(sources[i].data, sources[i].step, sources[i].size, rois[i].src,
                               destinations[i].data, destinations[i].step, destinations[i].size,
                               rois[i].dst, ctx);
    if (status != kSuccess) return status;
  }
  return kSuccess;
}

int nppiMirror_8u_C3R_Ctx(const unsigned char* src, int src_step, unsigned char* dst, int dst_step,
                          size2 roi, int axis, context ctx) {
  pthread_mutex_lock(&mutex);
  int result = failing("nppiMirror_8u_C3R_Ctx") ? fail_code : kSuccess;
  if (result == kSuccess) ++mirror_count;
  pthread_mutex_unlock(&mutex);
  if (result != kSuccess) return result;
  if (src == NULL || dst == NULL || ctx.stream == NULL) return kNullPointerError;
  if (axis != 1 || src == dst) return kSizeError; /* only the left-right mirror, out of place */
  for (int y = 0; y < roi.height; ++y) {
    for (int x = 0; x < roi.width; ++x) {
      memcpy(dst + (size_t)y * dst_step + (size_t)(roi.width - 1 - x) * 3,
             src + (size_t)y * src_step + (size_t)x * 3, 3);
    }
  }
  return kSuccess;
}

/* --- controls for the tests --- */

void fake_npp_fail(const char* name, int nth, int status) {
  pthread_mutex_lock(&mutex);
  snprintf(fail_name, sizeof fail_name, "%s", name);
  fail_nth = nth;
  fail_code = status;
  fail_seen = 0;
  resize_count = mirror_count = batch_count = 0;
  pthread_mutex_unlock(&mutex);
}

/* Copies up to `max` resizes recorded since fake_npp_fail; returns how many. */
size_t fake_npp_resizes(struct resize_record* out, size_t max) {
  pthread_mutex_lock(&mutex);
  size_t n = resize_count;
  for (size_t i = 0; i < n && i < max; ++i) out[i] = resizes[i];
  pthread_mutex_unlock(&mutex);
  return n;
}

/* Batched resize calls since fake_npp_fail (their images are recorded as resizes too). */
size_t fake_npp_batches(void) {
  pthread_mutex_lock(&mutex);
  size_t n = batch_count;
  pthread_mutex_unlock(&mutex);
  return n;
}

size_t fake_npp_mirrors(void) {
  pthread_mutex_lock(&mutex);
  size_t n = mirror_count;
  pthread_mutex_unlock(&mutex);
  return n;
}
