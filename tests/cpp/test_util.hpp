// Test fixtures: temporary directories and real JPEG files made with TurboJPEG.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <turbojpeg.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "prestage/prestage.hpp"

namespace prestage::test {

class TempDir {
 public:
  TempDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "prestage-test-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

// A smooth RGB test pattern that differs with `seed`, so every file decodes to different pixels.
inline std::vector<uint8_t> pattern(int width, int height, uint32_t seed) {
  std::vector<uint8_t> rgb(static_cast<size_t>(width) * height * 3);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      uint8_t* p = &rgb[(static_cast<size_t>(y) * width + x) * 3];
      p[0] = static_cast<uint8_t>((x * 255 / std::max(1, width - 1) + seed * 37) & 0xff);
      p[1] = static_cast<uint8_t>((y * 255 / std::max(1, height - 1) + seed * 11) & 0xff);
      p[2] = static_cast<uint8_t>(((x + y) * 2 + seed * 53) & 0xff);
    }
  }
  return rgb;
}

inline std::vector<unsigned char> encode_jpeg(const std::vector<uint8_t>& rgb, int width,
                                              int height, int quality = 90,
                                              int subsamp = TJSAMP_420) {
  tjhandle handle = tjInitCompress();
  unsigned char* out = nullptr;
  unsigned long size = 0;
  if (tjCompress2(handle, rgb.data(), width, 0, height, TJPF_RGB, &out, &size, subsamp, quality,
                  0) != 0) {
    tjDestroy(handle);
    throw std::runtime_error("tjCompress2 failed");
  }
  std::vector<unsigned char> bytes(out, out + size);
  tjFree(out);
  tjDestroy(handle);
  return bytes;
}

inline void write_file(const std::filesystem::path& path, const std::vector<unsigned char>& bytes) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

// A version 1.0 .npy file: `descr` ("<i2", ...), `shape` as NumPy writes it ("(3,)", "(2, 2)"),
// then `data`, the array's bytes.
inline void write_npy(const std::filesystem::path& path, const std::string& descr,
                      const std::string& shape, const std::string& data) {
  std::string header =
      "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string file = std::string("\x93NUMPY\x01\x00", 8) + char(header.size()) + char(0) + header;
  file += data;
  write_file(path, std::vector<unsigned char>(file.begin(), file.end()));
}

inline void write_jpeg(const std::filesystem::path& path, int width, int height, uint32_t seed) {
  write_file(path, encode_jpeg(pattern(width, height, seed), width, height));
}

// An ImageFolder tree: root/class_k/img_i.jpg, `per_class` images of width x height per class.
inline void make_image_folder(const std::filesystem::path& root, int classes, int per_class,
                              int width = 24, int height = 16) {
  uint32_t seed = 0;
  for (int c = 0; c < classes; ++c) {
    for (int i = 0; i < per_class; ++i) {
      write_jpeg(root / ("class_" + std::to_string(c)) / ("img_" + std::to_string(i) + ".jpg"),
                 width, height, seed++);
    }
  }
}

// What one epoch delivered: its batches laid end to end, and each batch's size.
struct Epoch {
  std::vector<int64_t> indices;
  std::vector<int64_t> labels;
  std::vector<std::byte> data;
  std::vector<size_t> sizes;
};

inline Epoch run_epoch(Loader& loader, uint64_t epoch) {
  Epoch seen;
  loader.start_epoch(epoch);
  while (auto batch = loader.next()) {
    seen.sizes.push_back(batch->size());
    seen.indices.insert(seen.indices.end(), batch->indices().begin(), batch->indices().end());
    seen.labels.insert(seen.labels.end(), batch->labels().begin(), batch->labels().end());
    seen.data.insert(seen.data.end(), batch->data().begin(), batch->data().end());
  }
  return seen;
}

// A FIFO with no writer at `path`: opening it blocks, as a read from a hung file server does. At
// the end of the test a writer lets the reads left behind finish.
class StalledFile {
 public:
  explicit StalledFile(std::filesystem::path path) : path_(std::move(path)) {
    if (::mkfifo(path_.c_str(), 0644) != 0) throw std::runtime_error("mkfifo " + path_.string());
  }
  ~StalledFile() {
    const int fd = ::open(path_.c_str(), O_WRONLY | O_NONBLOCK);
    if (fd >= 0) ::close(fd);
  }
  StalledFile(const StalledFile&) = delete;
  StalledFile& operator=(const StalledFile&) = delete;

 private:
  std::filesystem::path path_;
};

// dir/data/class_0's img_0, img_1, stalled.jpg (a StalledFile, made by the caller), img_2, img_3,
// img_4: with batches of 2 and no shuffle, the second batch waits on the stalled file.
inline Catalog stalled_third(const TempDir& dir) {
  return Catalog::from_paths(dir / "data",
                             {"class_0/img_0.jpg", "class_0/img_1.jpg", "class_0/stalled.jpg",
                              "class_0/img_2.jpg", "class_0/img_3.jpg", "class_0/img_4.jpg"});
}

// Lets the reader blocked in opening a FIFO go on: opens a writer once the reader waits, and closes
// it at once (the reader then fails: a FIFO is no regular file). Retries for up to 30 s; false if
// no reader came.
inline bool release_fifo_reader(const std::filesystem::path& path) {
  for (int tries = 0; tries < 6000; ++tries) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK);  // ENXIO until a reader waits
    if (fd >= 0) {
      ::close(fd);
      return true;
    }
    ::usleep(5000);
  }
  return false;
}

// The RGB pixels of a JPEG file, decoded by TurboJPEG directly (the oracle for loader output).
inline std::vector<uint8_t> decode_with_turbojpeg(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)), {});
  tjhandle h = tjInitDecompress();
  int w = 0, height = 0, sub = 0, cs = 0;
  std::vector<uint8_t> rgb;
  bool ok = tjDecompressHeader3(h, bytes.data(), bytes.size(), &w, &height, &sub, &cs) == 0;
  if (ok) {
    rgb.resize(static_cast<size_t>(w) * height * 3);
    ok = tjDecompress2(h, bytes.data(), bytes.size(), rgb.data(), w, 0, height, TJPF_RGB, 0) == 0;
  }
  tjDestroy(h);
  if (!ok) throw std::runtime_error("TurboJPEG cannot decode " + path.string());
  return rgb;
}

}  // namespace prestage::test
