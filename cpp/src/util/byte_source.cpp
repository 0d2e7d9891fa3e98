#include "util/byte_source.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "prestage/error.hpp"

namespace prestage::detail {

void MemorySource::read(uint64_t offset, std::span<std::byte> out) const {
  if (offset > bytes_.size() || out.size() > bytes_.size() - offset) {
    throw DecodeError(path_, "truncated: needs " + std::to_string(offset + out.size()) +
                                 " bytes, has " + std::to_string(bytes_.size()));
  }
  if (!out.empty()) std::memcpy(out.data(), bytes_.data() + offset, out.size());
}

std::span<const std::byte> ByteSource::all(std::vector<std::byte>& buffer) const {
  const auto bytes = memory();
  if (!bytes.empty()) return bytes;
  buffer.resize(size());
  read(0, buffer);
  return buffer;
}

FileSource FileSource::sample(const FileRef& file, const Catalog::Locator& loc, uint64_t size,
                              const std::string& path) {
  if (loc.length != Catalog::kWholeFile) return FileSource(file, loc.offset, loc.length, path);
  FileSource whole(file, 0, ~uint64_t{0}, path);
  whole.recorded_ = size;
  return whole;
}

std::span<const std::byte> FileSource::all(std::vector<std::byte>& buffer) const {
  if (open_ || (length_ == ~uint64_t{0} && offset_ != 0)) {
    buffer.resize(size());
    read(0, buffer);
  } else if (length_ != ~uint64_t{0}) {
    buffer.resize(length_);
    read_range(file_, offset_, buffer);
  } else if (recorded_ != Catalog::kUnknownSize) {
    buffer.resize(recorded_);
    read_file_exact(file_, buffer);
  } else {
    read_file(file_, buffer);
  }
  return buffer;
}

const OpenFile& FileSource::open() const {
  if (!open_) {
    open_.emplace(file_);
    if (length_ == ~uint64_t{0})
      length_ = open_->size() - std::min<uint64_t>(offset_, open_->size());
  }
  return *open_;
}

uint64_t FileSource::size() const {
  if (length_ == ~uint64_t{0}) open();
  return length_;
}

void FileSource::read(uint64_t offset, std::span<std::byte> out) const {
  const uint64_t length = size();
  if (offset > length || out.size() > length - offset) {
    throw DecodeError(path_, "truncated: needs " + std::to_string(offset + out.size()) +
                                 " bytes, has " + std::to_string(length));
  }
  open().read(offset_ + offset, out);
}

std::span<const std::byte> read_magic(const ByteSource& source, std::array<std::byte, 8>& buffer) {
  const auto head = std::span(buffer).first(
      static_cast<size_t>(std::min<uint64_t>(buffer.size(), source.size())));
  source.read(0, head);
  return head;
}

std::span<const std::byte> read_span(const ByteSource& source, uint64_t offset, uint64_t length,
                                     std::vector<std::byte>& buffer) {
  if (offset > source.size() || length > source.size() - offset) {
    throw DecodeError(source.path(), "truncated: needs " + std::to_string(offset + length) +
                                         " bytes, has " + std::to_string(source.size()));
  }
  const auto memory = source.memory();
  if (!memory.empty() || source.size() == 0) return memory.subspan(offset, length);
  if (buffer.size() < length) buffer.resize(length);
  std::span<std::byte> out(buffer.data(), length);
  source.read(offset, out);
  return out;
}

}  // namespace prestage::detail
