#include "decode/jpeg.hpp"

#include <turbojpeg.h>
// jpeglib.h needs size_t and FILE declared first.
#include <jpeglib.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <csetjmp>
#include <cstddef>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "decode/resize.hpp"
#include "prestage/error.hpp"

namespace prestage::detail {
namespace {

constexpr uint64_t kRgbBytes = 3;
constexpr uint64_t kCmykBytes = 4;
// Pixels decoded around a crop box (see crop_resize): fancy upsampling reads one chroma sample
// beyond each output pixel, up to 4 pixels away with 4:1:1 subsampling.
constexpr unsigned kMargin = 4;

template <typename T>
void grow(std::vector<T>& buffer, size_t size) {
  if (buffer.size() < size) buffer.resize(size);
}

// Python's round() of excess / 2 (half to even): torchvision's CenterCrop computes its offsets so.
int64_t centre_offset(int64_t excess) {
  const int64_t half = excess / 2;
  return (excess % 2 == 1 && half % 2 == 1) ? half + 1 : half;
}

// Pillow reads every CMYK JPEG as Adobe-inverted ("CMYK;I") and converts it with cmyk2rgb, so the
// same integer arithmetic here gives Pillow's pixels. TurboJPEG hands back the stored (inverted)
// samples, and cannot convert CMYK to RGB itself. In place is allowed: pixel i is read before bytes
// [3i, 3i + 3) are written, and those never reach pixel i + 1.
void cmyk_to_rgb(const uint8_t* cmyk, uint8_t* rgb, size_t pixels) {
  auto muldiv255 = [](int a, int b) {
    const int t = a * b + 128;
    return ((t >> 8) + t) >> 8;
  };
  for (size_t i = 0; i < pixels; ++i, cmyk += kCmykBytes, rgb += kRgbBytes) {
    const int c = 255 - cmyk[0];
    const int m = 255 - cmyk[1];
    const int y = 255 - cmyk[2];
    const int not_k = cmyk[3];
    rgb[0] = static_cast<uint8_t>(not_k - muldiv255(c, not_k));
    rgb[1] = static_cast<uint8_t>(not_k - muldiv255(m, not_k));
    rgb[2] = static_cast<uint8_t>(not_k - muldiv255(y, not_k));
  }
}

bool is_cmyk(int colorspace) { return colorspace == TJCS_CMYK || colorspace == TJCS_YCCK; }

// Image dimensions are at most 65535 (JPEG's limit), so this only fails where size_t is 32 bits.
size_t image_bytes(int width, int height, uint64_t bytes_per_pixel, const std::string& path) {
  const uint64_t bytes =
      static_cast<uint64_t>(width) * static_cast<uint64_t>(height) * bytes_per_pixel;
  if (bytes > std::numeric_limits<size_t>::max()) {
    throw DecodeError(path, "image too large for this platform");
  }
  return static_cast<size_t>(bytes);
}

// libjpeg reports errors by calling error_exit, which must not return: it jumps back to the
// setjmp of the call in progress. Warnings (corrupt data that libjpeg papers over, such as a
// premature end of file) are errors here too, as TurboJPEG's calls report them above.
struct LibjpegErrors {
  jpeg_error_mgr manager;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void libjpeg_error_exit(j_common_ptr cinfo) {
  auto* errors = reinterpret_cast<LibjpegErrors*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, errors->message);
  std::longjmp(errors->jump, 1);
}

void libjpeg_emit_message(j_common_ptr cinfo, int level) {
  if (level >= 0) return;  // trace messages
  auto* errors = reinterpret_cast<LibjpegErrors*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, errors->message);
  std::longjmp(errors->jump, 1);
}

// Whether the file ends with an end-of-image marker (trailing padding of up to 4 KiB allowed).
// Inside entropy-coded data 0xFF is always followed by 0x00 or a restart marker, so 0xFF 0xD9
// there is the real end.
bool has_end_marker(std::span<const std::byte> jpeg) {
  const size_t n = jpeg.size();
  const size_t stop = n > 4096 ? n - 4096 : 0;
  for (size_t i = n; i >= stop + 2; --i) {
    if (jpeg[i - 2] == std::byte{0xFF} && jpeg[i - 1] == std::byte{0xD9}) return true;
  }
  return false;
}

}  // namespace

struct JpegDecoder::Impl {
  struct Header {
    int width = 0;
    int height = 0;
    int colorspace = 0;
  };

  tjhandle handle = nullptr;
  uint64_t max_pixels = 0;
  // TurboJPEG's own table, in its own order (largest first): tjDecompress2 picks the first factor
  // that fits the requested size, and so must we to know which one it used.
  const tjscalingfactor* factors = nullptr;
  int factor_count = 0;
  // DCT-scaled or CMYK decodes land here before being resampled or converted.
  std::vector<uint8_t> decoded;
  ResizeScratch resize;
  // The libjpeg API, for decoding a region only (TurboJPEG 2.1 cannot). Created once.
  jpeg_decompress_struct cinfo{};
  LibjpegErrors errors{};
  bool cinfo_ready = false;

  // Reads the header with libjpeg; leaves `cinfo` ready for start_region or aborts it on error.
  // Returns false with errors.message set on failure. No C++ object lives across the setjmp.
  bool libjpeg_header(std::span<const std::byte> jpeg) {
    if (setjmp(errors.jump) != 0) {
      jpeg_abort_decompress(&cinfo);
      return false;
    }
    jpeg_mem_src(&cinfo, reinterpret_cast<const unsigned char*>(jpeg.data()),
                 static_cast<unsigned long>(jpeg.size()));
    if (jpeg_read_header(&cinfo, TRUE) != JPEG_HEADER_OK) {
      std::snprintf(errors.message, sizeof(errors.message), "no image in the file");
      jpeg_abort_decompress(&cinfo);
      return false;
    }
    return true;
  }

  // Decodes rows [y0, y1) and columns from x0 (width w, widened by libjpeg to iMCU boundaries;
  // the real first column comes back in *x_start, the row stride in *stride) of the image scaled by
  // 1/denom, into `region`. `cmyk`: decode to CMYK, else RGB.
  bool libjpeg_region(unsigned denom, bool cmyk, JDIMENSION x0, JDIMENSION w, JDIMENSION y0,
                      JDIMENSION y1, JDIMENSION* x_start, JDIMENSION* out_w) {
    if (setjmp(errors.jump) != 0) {
      jpeg_abort_decompress(&cinfo);
      return false;
    }
    cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_EXT_RGB;
    cinfo.scale_num = 1;
    cinfo.scale_denom = denom;
    cinfo.dct_method = JDCT_ISLOW;
    cinfo.do_fancy_upsampling = TRUE;
    jpeg_start_decompress(&cinfo);
    JDIMENSION xoff = x0;
    JDIMENSION width = w;
    jpeg_crop_scanline(&cinfo, &xoff, &width);
    const size_t stride = static_cast<size_t>(cinfo.output_width) * (cmyk ? kCmykBytes : kRgbBytes);
    const size_t rows = y1 - y0;
    if (decoded.size() < stride * rows) {
      // The caller grew `decoded` for the largest possible region; reaching here is a bug, and
      // longjmp must not cross a throw: report it as a failure instead.
      std::snprintf(errors.message, sizeof(errors.message),
                    "internal error: region buffer too small");
      jpeg_abort_decompress(&cinfo);
      return false;
    }
    if (y0 > 0 && jpeg_skip_scanlines(&cinfo, y0) != y0) {
      std::snprintf(errors.message, sizeof(errors.message), "cannot skip to row %u", y0);
      jpeg_abort_decompress(&cinfo);
      return false;
    }
    // Several rows per call: with 2x2 chroma subsampling, libjpeg makes two rows at a time and
    // a one-row request goes through an extra copy.
    constexpr size_t kRowsPerCall = 16;
    JSAMPROW row_pointers[kRowsPerCall];
    for (size_t r = 0; r < rows;) {
      const size_t want = std::min(kRowsPerCall, rows - r);
      for (size_t k = 0; k < want; ++k) row_pointers[k] = decoded.data() + (r + k) * stride;
      const JDIMENSION got =
          jpeg_read_scanlines(&cinfo, row_pointers, static_cast<JDIMENSION>(want));
      if (got == 0) {
        std::snprintf(errors.message, sizeof(errors.message), "cannot read row %zu", y0 + r);
        jpeg_abort_decompress(&cinfo);
        return false;
      }
      r += got;
    }
    *x_start = xoff;
    *out_w = cinfo.output_width;
    // The rest of the image is not needed: abort rather than decode it.
    jpeg_abort_decompress(&cinfo);
    return true;
  }

  void ensure_libjpeg() {
    if (cinfo_ready) return;
    cinfo.err = jpeg_std_error(&errors.manager);
    errors.manager.error_exit = libjpeg_error_exit;
    errors.manager.emit_message = libjpeg_emit_message;
    if (setjmp(errors.jump) != 0)
      throw Error(std::string("cannot create a libjpeg decompressor: ") + errors.message);
    jpeg_create_decompress(&cinfo);
    cinfo_ready = true;
  }

  // Reads the header with libjpeg and checks the size limit.
  Header crop_header(std::span<const std::byte> jpeg, const std::string& path) {
    if (jpeg.empty()) throw DecodeError(path, "empty file");
    if (jpeg.size() > ULONG_MAX) throw DecodeError(path, "file too large");
    ensure_libjpeg();
    if (!libjpeg_header(jpeg))
      throw DecodeError(path, std::string("cannot read JPEG header: ") + errors.message);
    Header header;
    header.width = static_cast<int>(cinfo.image_width);
    header.height = static_cast<int>(cinfo.image_height);
    const bool cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
    header.colorspace = cmyk ? TJCS_CMYK : TJCS_RGB;
    const uint64_t pixels = uint64_t{cinfo.image_width} * uint64_t{cinfo.image_height};
    if (header.width <= 0 || header.height <= 0 || pixels > max_pixels) {
      jpeg_abort_decompress(&cinfo);
      throw DecodeError(path, std::to_string(header.width) + " x " + std::to_string(header.height) +
                                  " pixels exceeds max_pixels " + std::to_string(max_pixels));
    }
    if (!has_end_marker(jpeg)) {
      jpeg_abort_decompress(&cinfo);
      throw DecodeError(path, "truncated JPEG file (no end-of-image marker)");
    }
    return header;
  }

  // After crop_header: decodes `box` of the image into `dst` (out_w x out_h RGB).
  void crop_resize(const Header& header, const CropBox& box, int out_w, int out_h, uint8_t* dst,
                   const std::string& path) {
    if (box.width <= 0 || box.height <= 0 || box.left < 0 || box.top < 0 ||
        box.left + box.width > header.width || box.top + box.height > header.height) {
      jpeg_abort_decompress(&cinfo);
      throw std::logic_error("JpegDecoder::decode_crop: box outside the image");
    }
    // The most DCT reduction that leaves the box at least as large as the output. Only 1/2, 1/4
    // and 1/8: libjpeg-turbo's other factors (7/8, 3/4, ...) use plain C inverse DCTs, and on
    // ImageNet-sized images decoding a crop at 7/8 or 3/4 costs more than at full scale.
    unsigned denom = 1;
    for (const unsigned d : {8u, 4u, 2u}) {
      if (static_cast<int64_t>(box.width) >= int64_t{out_w} * d &&
          static_cast<int64_t>(box.height) >= int64_t{out_h} * d) {
        denom = d;
        break;
      }
    }
    // The box in scaled pixels (fractional), and the whole pixels that cover it.
    const double scale = 1.0 / denom;
    const double bx0 = box.left * scale, bx1 = (box.left + box.width) * scale;
    const double by0 = box.top * scale, by1 = (box.top + box.height) * scale;
    const auto scaled_w =
        static_cast<JDIMENSION>((static_cast<int64_t>(header.width) + denom - 1) / denom);
    const auto scaled_h =
        static_cast<JDIMENSION>((static_cast<int64_t>(header.height) + denom - 1) / denom);
    const auto x0 = static_cast<JDIMENSION>(std::floor(bx0));
    const auto x1 = std::min(static_cast<JDIMENSION>(std::ceil(bx1)), scaled_w);
    const auto y0 = static_cast<JDIMENSION>(std::floor(by0));
    const auto y1 = std::min(static_cast<JDIMENSION>(std::ceil(by1)), scaled_h);
    // Chroma upsampling treats the decoded region's edges as the image's: decode a margin around
    // the box so that its own pixels are those of a full decode.
    const JDIMENSION rx0 = x0 > kMargin ? x0 - kMargin : 0;
    const JDIMENSION rx1 = std::min(x1 + kMargin, scaled_w);
    const JDIMENSION ry0 = y0 > kMargin ? y0 - kMargin : 0;
    const JDIMENSION ry1 = std::min(y1 + kMargin, scaled_h);
    const bool cmyk = is_cmyk(header.colorspace);
    // jpeg_crop_scanline widens the columns to iMCU boundaries (at most 32 pixels more on the left
    // and the right); the whole scaled row is an upper bound.
    grow(decoded, image_bytes(static_cast<int>(scaled_w), static_cast<int>(ry1 - ry0),
                              cmyk ? kCmykBytes : kRgbBytes, path));
    JDIMENSION x_start = 0, region_w = 0;
    if (!libjpeg_region(denom, cmyk, rx0, rx1 - rx0, ry0, ry1, &x_start, &region_w)) {
      throw DecodeError(path, std::string("cannot decode JPEG data: ") + errors.message);
    }
    if (cmyk)
      cmyk_to_rgb(decoded.data(), decoded.data(), static_cast<size_t>(region_w) * (ry1 - ry0));
    const size_t stride = static_cast<size_t>(region_w) * kRgbBytes;
    // The resampler sees only the box's own pixels (columns [x0, x1), rows [y0, y1)), so that
    // edges behave as after torchvision's crop.
    const uint8_t* src = decoded.data() + static_cast<size_t>(y0 - ry0) * stride +
                         static_cast<size_t>(x0 - x_start) * kRgbBytes;
    const int src_w = static_cast<int>(x1 - x0);
    const int src_h = static_cast<int>(y1 - y0);
    resize_rgb(src, src_w, src_h, stride, bx0 - x0, by0 - y0, std::min(bx1 - x0, double(src_w)),
               std::min(by1 - y0, double(src_h)), dst, out_w, out_h,
               static_cast<size_t>(out_w) * kRgbBytes, resize, box.flip);
  }

  std::string error_message() const { return tjGetErrorStr2(handle); }

  // TurboJPEG 2.1 leaves a handle whose header read failed mid-way in that state (it skips
  // jpeg_abort_decompress on its error path): the next header read then continues the old one and
  // fails on a good image ("Unsupported marker type", or a 0 x 0 size). After any failure, the
  // message is taken and the handle replaced.
  [[noreturn]] void fail(const std::string& path, const std::string& what) {
    const std::string message = what + error_message();
    if (tjhandle fresh = tjInitDecompress(); fresh != nullptr) {
      static_cast<void>(tjDestroy(handle));
      handle = fresh;
    }
    throw DecodeError(path, message);
  }

  Header read_header(std::span<const std::byte> jpeg, const std::string& path) {
    if (jpeg.empty()) throw DecodeError(path, "empty file");
    if (jpeg.size() > ULONG_MAX) throw DecodeError(path, "file too large");
    Header header;
    int subsampling = 0;
    if (tjDecompressHeader3(handle, reinterpret_cast<const unsigned char*>(jpeg.data()),
                            static_cast<unsigned long>(jpeg.size()), &header.width, &header.height,
                            &subsampling, &header.colorspace) != 0) {
      fail(path, "cannot read JPEG header: ");
    }
    if (header.width <= 0 || header.height <= 0) {
      throw DecodeError(path, "JPEG header has size " + std::to_string(header.width) + " x " +
                                  std::to_string(header.height));
    }
    const uint64_t pixels =
        static_cast<uint64_t>(header.width) * static_cast<uint64_t>(header.height);
    if (pixels > max_pixels) {
      throw DecodeError(path, std::to_string(header.width) + " x " + std::to_string(header.height) +
                                  " pixels exceeds max_pixels " + std::to_string(max_pixels));
    }
    return header;
  }

  // Every -1 is an error, warnings included: TurboJPEG reports a truncated file ("Premature end of
  // JPEG file") as a warning after filling the missing rows with grey, which must not reach a
  // batch. (tjGetErrorCode cannot tell the two apart reliably: it says "warning" for a fatal error
  // that followed one.)
  void decompress(std::span<const std::byte> jpeg, int width, int height, int pixel_format,
                  uint8_t* dst, const std::string& path) {
    const int pitch = width * tjPixelSize[pixel_format];
    if (tjDecompress2(handle, reinterpret_cast<const unsigned char*>(jpeg.data()),
                      static_cast<unsigned long>(jpeg.size()), dst, width, pitch, height,
                      pixel_format, 0) != 0) {
      fail(path, "cannot decode JPEG data: ");
    }
  }

  // Decodes at `width` x `height` (one of TurboJPEG's scaled sizes) into `decoded` as packed RGB.
  void decompress_to_scratch(std::span<const std::byte> jpeg, const Header& header, int width,
                             int height, const std::string& path) {
    const bool cmyk = is_cmyk(header.colorspace);
    grow(decoded, image_bytes(width, height, cmyk ? kCmykBytes : kRgbBytes, path));
    decompress(jpeg, width, height, cmyk ? TJPF_CMYK : TJPF_RGB, decoded.data(), path);
    if (cmyk) {
      cmyk_to_rgb(decoded.data(), decoded.data(), image_bytes(width, height, 1, path));
    }
  }

  // Full-size decode straight into `dst` (height x width x 3 bytes).
  void decompress_full(std::span<const std::byte> jpeg, const Header& header, uint8_t* dst,
                       const std::string& path) {
    if (!is_cmyk(header.colorspace)) {
      decompress(jpeg, header.width, header.height, TJPF_RGB, dst, path);
      return;
    }
    grow(decoded, image_bytes(header.width, header.height, kCmykBytes, path));
    decompress(jpeg, header.width, header.height, TJPF_CMYK, decoded.data(), path);
    cmyk_to_rgb(decoded.data(), dst, image_bytes(header.width, header.height, 1, path));
  }

  // The factor tjDecompress2 will use when asked for `width` x `height`.
  tjscalingfactor factor_chosen_for(const Header& header, int width, int height) const {
    for (int i = 0; i < factor_count; ++i) {
      if (TJSCALED(header.width, factors[i]) <= width &&
          TJSCALED(header.height, factors[i]) <= height) {
        return factors[i];
      }
    }
    return tjscalingfactor{1, 1};
  }
};

JpegDecoder::JpegDecoder(uint64_t max_pixels) : impl_(std::make_unique<Impl>()) {
  impl_->max_pixels = max_pixels;
  impl_->factors = tjGetScalingFactors(&impl_->factor_count);
  if (impl_->factors == nullptr || impl_->factor_count <= 0) {
    throw Error(std::string("TurboJPEG scaling factors unavailable: ") + tjGetErrorStr2(nullptr));
  }
  impl_->handle = tjInitDecompress();
  if (impl_->handle == nullptr) {
    throw Error(std::string("cannot create a TurboJPEG decompressor: ") + tjGetErrorStr2(nullptr));
  }
}

JpegDecoder::~JpegDecoder() {
  // tjDestroy fails only for an invalid handle, and a destructor has no one to report to.
  if (impl_ && impl_->handle != nullptr) static_cast<void>(tjDestroy(impl_->handle));
  if (impl_ && impl_->cinfo_ready) jpeg_destroy_decompress(&impl_->cinfo);
}

void JpegDecoder::decode_crop(std::span<const std::byte> jpeg, const CropBox& box, ImageSize size,
                              std::span<std::byte> out, const std::string& path) {
  if (size.height == 0 || size.width == 0 || size.height > INT_MAX || size.width > INT_MAX ||
      out.size() != uint64_t{size.height} * uint64_t{size.width} * kRgbBytes) {
    throw std::logic_error("JpegDecoder::decode_crop: output size out of range");
  }
  const Impl::Header header = impl_->crop_header(jpeg, path);
  impl_->crop_resize(header, box, static_cast<int>(size.width), static_cast<int>(size.height),
                     reinterpret_cast<uint8_t*>(out.data()), path);
}

CropBox JpegDecoder::decode_random_crop(std::span<const std::byte> jpeg, ImageSize size,
                                        uint64_t seed, uint64_t epoch, uint64_t index,
                                        std::span<std::byte> out, const std::string& path) {
  if (size.height == 0 || size.width == 0 || size.height > INT_MAX || size.width > INT_MAX ||
      out.size() != uint64_t{size.height} * uint64_t{size.width} * kRgbBytes) {
    throw std::logic_error("JpegDecoder::decode_random_crop: output size out of range");
  }
  const Impl::Header header = impl_->crop_header(jpeg, path);
  const CropBox box = random_resized_crop(seed, epoch, index, header.height, header.width);
  impl_->crop_resize(header, box, static_cast<int>(size.width), static_cast<int>(size.height),
                     reinterpret_cast<uint8_t*>(out.data()), path);
  return box;
}

ImageHeader JpegDecoder::header(std::span<const std::byte> jpeg, const std::string& path) {
  const Impl::Header header = impl_->read_header(jpeg, path);
  return ImageHeader{header.width, header.height};
}

void JpegDecoder::decode_exact(std::span<const std::byte> jpeg, ImageSize size,
                               std::span<std::byte> out, const std::string& path) {
  const Impl::Header header = impl_->read_header(jpeg, path);
  if (static_cast<uint64_t>(header.width) != size.width ||
      static_cast<uint64_t>(header.height) != size.height) {
    throw DecodeError(path, "image is " + std::to_string(header.width) + "x" +
                                std::to_string(header.height) + ", expected " +
                                std::to_string(size.width) + "x" + std::to_string(size.height));
  }
  if (out.size() != image_bytes(header.width, header.height, kRgbBytes, path)) {
    throw std::logic_error("JpegDecoder::decode_exact: output buffer has the wrong size");
  }
  impl_->decompress_full(jpeg, header, reinterpret_cast<uint8_t*>(out.data()), path);
}

void JpegDecoder::decode_resized(std::span<const std::byte> jpeg, ImageSize size,
                                 std::span<std::byte> out, const std::string& path) {
  if (size.height == 0 || size.width == 0 || size.height > INT_MAX || size.width > INT_MAX) {
    throw std::logic_error("JpegDecoder::decode_resized: output size out of range");
  }
  const uint64_t out_bytes = uint64_t{size.height} * uint64_t{size.width} * kRgbBytes;
  if (out.size() != out_bytes) {
    throw std::logic_error("JpegDecoder::decode_resized: output buffer has the wrong size");
  }
  const Impl::Header header = impl_->read_header(jpeg, path);
  const int out_h = static_cast<int>(size.height);
  const int out_w = static_cast<int>(size.width);
  uint8_t* dst = reinterpret_cast<uint8_t*>(out.data());

  // The size that Resize would give: the side that binds is scaled to the output exactly and the
  // other one is truncated, as torchvision's Resize(int) computes int(size * long / short).
  // Integer arithmetic keeps that exact (dimensions are < 2^16, output sides < 2^31).
  const int64_t h = header.height;
  const int64_t w = header.width;
  int64_t resized_h = out_h;
  int64_t resized_w = out_w;
  if (int64_t{out_h} * w >= int64_t{out_w} * h) {
    resized_w = std::max<int64_t>(out_w, int64_t{out_h} * w / h);
  } else {
    resized_h = std::max<int64_t>(out_h, int64_t{out_w} * h / w);
  }
  const int64_t top = centre_offset(resized_h - out_h);
  const int64_t left = centre_offset(resized_w - out_w);

  // The most DCT reduction that still leaves at least the resized size, so the resampler only ever
  // shrinks. Only 1/2, 1/4 and 1/8 are considered: the other factors (3/8, 5/8, ...) cost about as
  // much as a full decode.
  int decoded_w = header.width;
  int decoded_h = header.height;
  int best_denom = 1;
  for (int i = 0; i < impl_->factor_count; ++i) {
    const tjscalingfactor factor = impl_->factors[i];
    if (factor.num != 1 || (factor.denom != 2 && factor.denom != 4 && factor.denom != 8) ||
        factor.denom <= best_denom) {
      continue;
    }
    const int scaled_w = TJSCALED(header.width, factor);
    const int scaled_h = TJSCALED(header.height, factor);
    if (scaled_w >= resized_w && scaled_h >= resized_h) {
      decoded_w = scaled_w;
      decoded_h = scaled_h;
      best_denom = factor.denom;
    }
  }

  if (decoded_w == out_w && decoded_h == out_h && decoded_w == header.width &&
      decoded_h == header.height) {
    impl_->decompress_full(jpeg, header, dst, path);
    return;
  }

  // Another factor may give the same scaled size (tiny images); map coordinates with the one
  // TurboJPEG actually applies.
  const tjscalingfactor used = impl_->factor_chosen_for(header, decoded_w, decoded_h);
  impl_->decompress_to_scratch(jpeg, header, decoded_w, decoded_h, path);

  // The crop box in source pixels is [left, left + out_w) * width / resized_w (likewise in y);
  // resampling that box straight to the output is Resize followed by CenterCrop in one pass.
  const double to_decoded_x =
      static_cast<double>(header.width) / static_cast<double>(resized_w) * used.num / used.denom;
  const double to_decoded_y =
      static_cast<double>(header.height) / static_cast<double>(resized_h) * used.num / used.denom;
  const double x0 = static_cast<double>(left) * to_decoded_x;
  const double y0 = static_cast<double>(top) * to_decoded_y;
  const double x1 =
      std::min(static_cast<double>(left + out_w) * to_decoded_x, static_cast<double>(decoded_w));
  const double y1 =
      std::min(static_cast<double>(top + out_h) * to_decoded_y, static_cast<double>(decoded_h));
  resize_rgb(impl_->decoded.data(), decoded_w, decoded_h,
             static_cast<size_t>(decoded_w) * kRgbBytes, x0, y0, x1, y1, dst, out_w, out_h,
             static_cast<size_t>(out_w) * kRgbBytes, impl_->resize);
}

}  // namespace prestage::detail
