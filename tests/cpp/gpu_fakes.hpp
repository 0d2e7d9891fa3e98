// The controls of the test doubles of the CUDA runtime, nvJPEG and NPP (fake_cudart.c,
// fake_nvjpeg.c, fake_npp.c, at FAKE_*_PATH), and the JPEGs the GPU tests decode. Shared by
// gpu_jpeg_test (the decoder) and gpu_loader_test (the Loader with decode_device=cuda).
#pragma once

#include <doctest/doctest.h>

#include <dlfcn.h>
#include <turbojpeg.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace prestage::test {

struct ResizeRecord {  // fake_npp.c's resize_record
  int x, y, width, height, dst_width, dst_height, interpolation;
  void* stream;
};

// Kinds of objects the doubles count, in the order of Fakes::objects().
enum GpuObject {
  kDevice = 0,
  kPinned = 1,
  kStream = 2,
  kEvent = 3,
  kHandle = 4,
  kState = 5,
  kJpegStream = 6,
  kDecodeParams = 7
};

// The doubles' controls. dlopen of a path already loaded (by the code under test) returns that
// library, so these are the same doubles it calls. Every failure injected is cleared at both ends.
struct Fakes {
  void* cudart = ::dlopen(FAKE_CUDART_PATH, RTLD_NOW | RTLD_LOCAL);
  void* nvjpeg = ::dlopen(FAKE_NVJPEG_PATH, RTLD_NOW | RTLD_LOCAL);
  void* npp = ::dlopen(FAKE_NPP_PATH, RTLD_NOW | RTLD_LOCAL);
  void (*cuda_objects)(int, size_t*) = nullptr;
  void (*cuda_fail)(const char*, int, int) = nullptr;
  void (*configure)(unsigned, unsigned) = nullptr;
  void (*nvjpeg_fail)(const char*, int, int) = nullptr;
  void (*nvjpeg_objects)(int, size_t*) = nullptr;
  size_t (*batches)(int*, size_t) = nullptr;
  void (*npp_fail)(const char*, int, int) = nullptr;
  size_t (*resizes)(ResizeRecord*, size_t) = nullptr;
  size_t (*mirrors)() = nullptr;
  size_t (*npp_batches)() = nullptr;         // batched resize calls
  void (*image_ns)(uint64_t) = nullptr;      // virtual GPU time per image of a batched decode
  void (*not_ready)(int) = nullptr;          // the next n cudaEventElapsedTime calls: not ready
  void (*roi_image_ns)(uint64_t) = nullptr;  // the same per image decoded as a region only
  void (*first_roi_ns)(uint64_t) = nullptr;  // more at a decoder's first region decode
  size_t (*rois)(int*, size_t) = nullptr;

  template <typename F>
  static void get(void* library, const char* name, F& out) {
    void* symbol = ::dlsym(library, name);
    REQUIRE(symbol != nullptr);
    out = reinterpret_cast<F>(symbol);
  }
  // `engines`: the hardware JPEG engines the nvJPEG double reports (0: none).
  explicit Fakes(unsigned engines) {
    REQUIRE(cudart != nullptr);
    REQUIRE(nvjpeg != nullptr);
    REQUIRE(npp != nullptr);
    get(cudart, "fake_cudart_objects", cuda_objects);
    get(cudart, "fake_cudart_fail", cuda_fail);
    get(nvjpeg, "fake_nvjpeg_configure", configure);
    get(nvjpeg, "fake_nvjpeg_fail", nvjpeg_fail);
    get(nvjpeg, "fake_nvjpeg_objects", nvjpeg_objects);
    get(nvjpeg, "fake_nvjpeg_batches", batches);
    get(npp, "fake_npp_fail", npp_fail);
    get(npp, "fake_npp_resizes", resizes);
    get(npp, "fake_npp_mirrors", mirrors);
    get(npp, "fake_npp_batches", npp_batches);
    get(nvjpeg, "fake_nvjpeg_image_ns", image_ns);
    get(cudart, "fake_cudart_not_ready", not_ready);
    get(nvjpeg, "fake_nvjpeg_roi_image_ns", roi_image_ns);
    get(nvjpeg, "fake_nvjpeg_first_roi_ns", first_roi_ns);
    get(nvjpeg, "fake_nvjpeg_rois", rois);
    configure(engines, 1);
    clear_failures();  // npp_fail also clears the resize record
  }
  ~Fakes() {
    clear_failures();
    ::dlclose(npp);
    ::dlclose(nvjpeg);
    ::dlclose(cudart);
  }
  Fakes(const Fakes&) = delete;
  Fakes& operator=(const Fakes&) = delete;

  // Also back to no GPU time per image and timings always ready.
  void clear_failures() const {
    image_ns(0);
    roi_image_ns(0);
    first_roi_ns(0);
    not_ready(0);
    cuda_fail("", 0, 0);
    nvjpeg_fail("", 0, 0);
    npp_fail("", 0, 0);
  }
  // Per GpuObject kind: created, destroyed, bad destructions.
  std::vector<size_t> objects() const {
    std::vector<size_t> out;
    size_t c[3];
    for (int kind = 0; kind < 4; ++kind) {
      cuda_objects(kind, c);
      out.insert(out.end(), c, c + 3);
    }
    for (int kind = 0; kind < 4; ++kind) {
      nvjpeg_objects(kind, c);
      out.insert(out.end(), c, c + 3);
    }
    return out;
  }
  // (backend, images) of each batched decode.
  std::vector<std::pair<int, int>> batch_log() const {
    std::vector<int> raw(2 * 256);
    const size_t n = std::min<size_t>(batches(raw.data(), 256), 256);
    std::vector<std::pair<int, int>> out;
    for (size_t i = 0; i < n; ++i) out.emplace_back(raw[2 * i], raw[2 * i + 1]);
    return out;
  }
  // (x, y, width, height) of each region nvjpegDecodeBatchedEx decoded.
  std::vector<std::array<int, 4>> roi_log() const {
    std::vector<int> raw(4 * 4096);
    const size_t n = std::min<size_t>(rois(raw.data(), 4096), 4096);
    std::vector<std::array<int, 4>> out;
    for (size_t i = 0; i < n; ++i)
      out.push_back({raw[4 * i], raw[4 * i + 1], raw[4 * i + 2], raw[4 * i + 3]});
    return out;
  }
  std::vector<ResizeRecord> resize_log() const {
    std::vector<ResizeRecord> out(4096);
    out.resize(std::min<size_t>(resizes(out.data(), out.size()), out.size()));
    return out;
  }
};

// Objects of `kind` created between two Fakes::objects() records; of every kind.
inline size_t created(const std::vector<size_t>& before, const std::vector<size_t>& after,
                      GpuObject kind) {
  return after[3 * kind] - before[3 * kind];
}
inline size_t created_since(const std::vector<size_t>& before, const std::vector<size_t>& after) {
  size_t n = 0;
  for (size_t k = 0; k < after.size(); k += 3) n += after[k] - before[k];
  return n;
}

// Every object created between `before` and `after` was destroyed once, none twice or unknown.
inline void check_balanced(const std::vector<size_t>& before, const std::vector<size_t>& after) {
  REQUIRE(before.size() == after.size());
  for (size_t k = 0; k < after.size(); k += 3) {
    CAPTURE(k / 3);
    CHECK(after[k] - before[k] == after[k + 1] - before[k + 1]);  // created == destroyed
    CHECK(after[k + 2] == before[k + 2]);                         // no bad destruction
  }
}

// A smooth image (no wrap-around), so that different resampling filters agree closely: RGB.
inline std::vector<uint8_t> smooth_rgb(int width, int height, int seed) {
  std::vector<uint8_t> rgb(static_cast<size_t>(width) * height * 3);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      uint8_t* p = &rgb[(static_cast<size_t>(y) * width + x) * 3];
      p[0] = static_cast<uint8_t>(20 + 200 * x / width);
      p[1] = static_cast<uint8_t>(20 + 200 * y / height);
      p[2] = static_cast<uint8_t>(60 + (seed * 13 % 60) + 60 * (x + y) / (width + height));
    }
  }
  return rgb;
}

// smooth_rgb() as a JPEG of quality 95 (`cmyk`: inverted, with K = 0, as an Adobe CMYK JPEG).
inline std::vector<unsigned char> smooth_jpeg(int width, int height, int seed,
                                              int subsamp = TJSAMP_420, int flags = 0,
                                              bool cmyk = false) {
  const std::vector<uint8_t> rgb = smooth_rgb(width, height, seed);
  std::vector<uint8_t> pixels = rgb;
  if (cmyk) {
    pixels.assign(static_cast<size_t>(width) * height * 4, 0);
    for (size_t i = 0; i < static_cast<size_t>(width) * height; ++i) {
      for (int c = 0; c < 3; ++c) pixels[4 * i + c] = static_cast<uint8_t>(255 - rgb[3 * i + c]);
    }
  }
  tjhandle handle = tjInitCompress();
  unsigned char* out = nullptr;
  unsigned long size = 0;
  const int rc = tjCompress2(handle, pixels.data(), width, 0, height, cmyk ? TJPF_CMYK : TJPF_RGB,
                             &out, &size, subsamp, 95, flags);
  tjDestroy(handle);
  REQUIRE(rc == 0);
  std::vector<unsigned char> bytes(out, out + size);
  tjFree(out);
  return bytes;
}

}  // namespace prestage::test
