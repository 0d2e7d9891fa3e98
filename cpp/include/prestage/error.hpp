// One error vocabulary: every exception the public API throws derives from prestage::Error.
#pragma once

#include <stdexcept>
#include <string>

namespace prestage {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An option or argument is invalid, or a call that the loader's state does not allow (a closed
// loader, every batch buffer held by the caller); the message names it.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// A file could not be opened, read, written or renamed. Carries the path and the errno value.
class IoError : public Error {
 public:
  IoError(std::string path, int error_code, const std::string& what);
  const std::string& path() const noexcept { return path_; }
  int error_code() const noexcept { return error_code_; }

 private:
  std::string path_;
  int error_code_;
};

// A sample's bytes could not be decoded (corrupt, truncated, wrong format or size).
class DecodeError : public Error {
 public:
  DecodeError(std::string path, std::string reason);
  const std::string& path() const noexcept { return path_; }
  const std::string& reason() const noexcept { return reason_; }

 private:
  std::string path_;
  std::string reason_;
};

}  // namespace prestage
