#include "prestage/error.hpp"

#include <utility>

namespace prestage {

IoError::IoError(std::string path, int error_code, const std::string& what)
    : Error(what), path_(std::move(path)), error_code_(error_code) {}

DecodeError::DecodeError(std::string path, std::string reason)
    : Error(path + ": " + reason), path_(std::move(path)), reason_(std::move(reason)) {}

}  // namespace prestage
