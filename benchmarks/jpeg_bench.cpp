// Stage 3 codec benchmark: where the JPEG training path's time goes, on one thread, against a full
// decode of the same images. CPU time of the calling thread, so that other jobs on the machine
// change the figures less than wall time would; each figure is the median of --runs passes over
// every image, after one warm-up pass.
//
//   jpeg_bench [--runs N] [--size S] IMAGE.jpg...
//
// Prints JSON, milliseconds per image:
//   full_decode        TurboJPEG tjDecompress2 to RGB, whole image (what tjbench times)
//   crop_path          JpegDecoder::decode_random_crop to S x S (seed 0, epoch 0, index = position)
//   entropy_to_crop    libjpeg: Huffman decoding of every row down to the crop's last one only
//   crop_region        libjpeg: the crop's rows and columns (plus the codec's margin) at full scale
//   resize             resize_rgb of that region to S x S, flipped as drawn
// The last three split crop_path for crops decoded at full scale (all but the few at least twice
// the output, which the codec decodes at 1/2, 1/4 or 1/8).
#include <turbojpeg.h>
// jpeglib.h needs size_t and FILE declared first.
#include <cstddef>
#include <cstdio>

#include <jpeglib.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iterator>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "decode/jpeg.hpp"
#include "decode/resize.hpp"
#include "decode/transform.hpp"

namespace {

using prestage::detail::CropBox;

double thread_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

std::vector<unsigned char> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// The libjpeg side of the split. Errors end the program: the inputs are the benchmark's own.
class Libjpeg {
 public:
  Libjpeg() {
    cinfo_.err = jpeg_std_error(&errors_);
    jpeg_create_decompress(&cinfo_);
  }
  ~Libjpeg() { jpeg_destroy_decompress(&cinfo_); }
  Libjpeg(const Libjpeg&) = delete;
  Libjpeg& operator=(const Libjpeg&) = delete;

  void size(const std::vector<unsigned char>& jpeg, int* width, int* height) {
    start(jpeg);
    *width = static_cast<int>(cinfo_.image_width);
    *height = static_cast<int>(cinfo_.image_height);
    jpeg_abort_decompress(&cinfo_);
  }

  void entropy_to(const std::vector<unsigned char>& jpeg, int last_row) {
    start(jpeg);
    jpeg_start_decompress(&cinfo_);
    jpeg_skip_scanlines(&cinfo_, static_cast<JDIMENSION>(last_row));
    jpeg_abort_decompress(&cinfo_);
  }

  // Decodes box plus `margin` pixels around it into `region`; returns a pointer to the box's
  // first pixel and its row stride.
  const unsigned char* region(const std::vector<unsigned char>& jpeg, const CropBox& box,
                              int margin, std::vector<unsigned char>& region, size_t* stride) {
    start(jpeg);
    jpeg_start_decompress(&cinfo_);
    const int width = static_cast<int>(cinfo_.output_width);
    const int height = static_cast<int>(cinfo_.output_height);
    JDIMENSION x0 = static_cast<JDIMENSION>(std::max(0, box.left - margin));
    JDIMENSION w = static_cast<JDIMENSION>(std::min(width, box.left + box.width + margin)) - x0;
    jpeg_crop_scanline(&cinfo_, &x0, &w);
    const int y0 = std::max(0, box.top - margin);
    const int y1 = std::min(height, box.top + box.height + margin);
    *stride = static_cast<size_t>(cinfo_.output_width) * 3;
    region.resize(*stride * static_cast<size_t>(y1 - y0));
    jpeg_skip_scanlines(&cinfo_, static_cast<JDIMENSION>(y0));
    for (int y = y0; y < y1;) {
      JSAMPROW rows[16];
      const int want = std::min(16, y1 - y);
      for (int k = 0; k < want; ++k) {
        rows[k] = region.data() + static_cast<size_t>(y - y0 + k) * *stride;
      }
      y += static_cast<int>(jpeg_read_scanlines(&cinfo_, rows, static_cast<JDIMENSION>(want)));
    }
    jpeg_abort_decompress(&cinfo_);
    return region.data() + static_cast<size_t>(box.top - y0) * *stride +
           static_cast<size_t>(box.left - static_cast<int>(x0)) * 3;
  }

 private:
  void start(const std::vector<unsigned char>& jpeg) {
    jpeg_mem_src(&cinfo_, jpeg.data(), static_cast<unsigned long>(jpeg.size()));
    jpeg_read_header(&cinfo_, TRUE);
    cinfo_.out_color_space = JCS_EXT_RGB;
    cinfo_.dct_method = JDCT_ISLOW;
  }
  jpeg_decompress_struct cinfo_{};
  jpeg_error_mgr errors_{};
};

}  // namespace

int main(int argc, char** argv) {
  int runs = 5;
  int size = 224;
  std::vector<std::string> paths;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--runs" && i + 1 < argc) {
      runs = std::atoi(argv[++i]);
    } else if (arg == "--size" && i + 1 < argc) {
      size = std::atoi(argv[++i]);
    } else {
      paths.push_back(arg);
    }
  }
  if (paths.empty() || runs < 1 || size < 1) {
    std::fprintf(stderr, "usage: jpeg_bench [--runs N] [--size S] IMAGE.jpg...\n");
    return 2;
  }
  // The codec's margin around a crop (decode/jpeg.cpp): chroma upsampling reads that far.
  constexpr int kMargin = 4;

  std::vector<std::vector<unsigned char>> files;
  std::vector<CropBox> boxes;
  Libjpeg libjpeg;
  double area = 0, depth = 0;
  for (size_t i = 0; i < paths.size(); ++i) {
    files.push_back(read_all(paths[i]));
    int width = 0, height = 0;
    libjpeg.size(files.back(), &width, &height);
    boxes.push_back(prestage::detail::random_resized_crop(0, 0, i, height, width));
    const CropBox& b = boxes.back();
    area += static_cast<double>(b.width) * b.height / (static_cast<double>(width) * height);
    depth += static_cast<double>(b.top + b.height) / height;
  }

  tjhandle turbo = tjInitDecompress();
  prestage::detail::JpegDecoder decoder(uint64_t{1} << 32);
  prestage::detail::ResizeScratch scratch;
  std::vector<unsigned char> full, region;
  std::vector<std::byte> out(static_cast<size_t>(size) * size * 3);
  const prestage::ImageSize out_size{static_cast<uint32_t>(size), static_cast<uint32_t>(size)};

  enum { kFull, kCrop, kEntropy, kRegion, kResize, kFigures };
  std::vector<std::vector<double>> seconds(kFigures);
  for (int run = 0; run <= runs; ++run) {
    double t[kFigures] = {};
    for (size_t i = 0; i < files.size(); ++i) {
      const auto& jpeg = files[i];
      const CropBox& box = boxes[i];
      double a = thread_seconds();
      int width = 0, height = 0, subsampling = 0, colorspace = 0;
      tjDecompressHeader3(turbo, jpeg.data(), static_cast<unsigned long>(jpeg.size()), &width,
                          &height, &subsampling, &colorspace);
      full.resize(static_cast<size_t>(width) * height * 3);
      if (tjDecompress2(turbo, jpeg.data(), static_cast<unsigned long>(jpeg.size()), full.data(),
                        width, 0, height, TJPF_RGB, 0) != 0) {
        std::fprintf(stderr, "%s: %s\n", paths[i].c_str(), tjGetErrorStr2(turbo));
        return 1;
      }
      double b = thread_seconds();
      t[kFull] += b - a;
      decoder.decode_random_crop(std::as_bytes(std::span(jpeg)), out_size, 0, 0, i, out, paths[i]);
      a = thread_seconds();
      t[kCrop] += a - b;
      libjpeg.entropy_to(jpeg, box.top + box.height);
      b = thread_seconds();
      t[kEntropy] += b - a;
      size_t stride = 0;
      const unsigned char* corner = libjpeg.region(jpeg, box, kMargin, region, &stride);
      a = thread_seconds();
      t[kRegion] += a - b;
      prestage::detail::resize_rgb(corner, box.width, box.height, stride, 0, 0, box.width,
                                   box.height, reinterpret_cast<uint8_t*>(out.data()), size, size,
                                   static_cast<size_t>(size) * 3, scratch, box.flip);
      t[kResize] += thread_seconds() - a;
    }
    if (run == 0) continue;  // warm-up
    for (int f = 0; f < kFigures; ++f) seconds[f].push_back(t[f]);
  }
  tjDestroy(turbo);

  const double n = static_cast<double>(files.size());
  auto ms = [&](int f) { return median(seconds[f]) / n * 1e3; };
  std::printf(
      "{\"images\": %zu, \"runs\": %d, \"size\": %d, \"mean_crop_area\": %.3f, "
      "\"mean_crop_last_row\": %.3f,\n \"ms_per_image\": {\"full_decode\": %.3f, \"crop_path\": "
      "%.3f, \"entropy_to_crop\": %.3f, \"crop_region\": %.3f, \"resize\": %.3f},\n "
      "\"crop_path_speed_over_full_decode\": %.3f}\n",
      files.size(), runs, size, area / n, depth / n, ms(kFull), ms(kCrop), ms(kEntropy),
      ms(kRegion), ms(kResize), ms(kFull) / ms(kCrop));
  return 0;
}
