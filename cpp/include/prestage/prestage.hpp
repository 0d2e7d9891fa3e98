// prestage: overlap staging from a parallel file system to node-local SSD with mini-batch decoding.
#pragma once

#include "prestage/batch.hpp"
#include "prestage/catalog.hpp"
#include "prestage/error.hpp"
#include "prestage/loader.hpp"
#include "prestage/options.hpp"
#include "prestage/pinning.hpp"
#include "prestage/plan.hpp"
#include "prestage/stats.hpp"

namespace prestage {
inline constexpr const char* kVersion = "0.1.0";
}
