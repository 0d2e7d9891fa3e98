// Reads a class-per-folder JPEG set through prestage's three stages and prints batch shapes and
// throughput: the smallest complete use of the installed C++ API.
//
//   prestage_example DATA_DIR [--batch-size N] [--image-size H W] [--epochs E]
//                             [--readers R] [--prefetchers P] [--stage-dir DIR]
#include <prestage/prestage.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

namespace {

struct Args {
  std::string data;
  std::string stage_dir;
  uint64_t batch_size = 64;
  uint32_t height = 224;
  uint32_t width = 224;
  uint64_t epochs = 2;
  uint64_t readers = 2;
  uint64_t prefetchers = 4;
};

[[noreturn]] void usage(const char* program) {
  std::fprintf(stderr,
               "usage: %s DATA_DIR [--batch-size N] [--image-size H W] [--epochs E] [--readers R]\n"
               "       [--prefetchers P] [--stage-dir DIR]\n"
               "DATA_DIR holds one folder of JPEG files per class (e.g. from `prestage synth`).\n",
               program);
  std::exit(2);
}

uint64_t positive(const char* program, const char* text) {
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text, &end, 10);
  if (end == text || *end != '\0' || value == 0 || text[0] == '-') usage(program);
  return value;
}

Args parse(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--batch-size" && has_value) {
      args.batch_size = positive(argv[0], argv[++i]);
    } else if (arg == "--image-size" && i + 2 < argc) {
      args.height = static_cast<uint32_t>(positive(argv[0], argv[++i]));
      args.width = static_cast<uint32_t>(positive(argv[0], argv[++i]));
    } else if (arg == "--epochs" && has_value) {
      args.epochs = positive(argv[0], argv[++i]);
    } else if (arg == "--readers" && has_value) {
      args.readers = positive(argv[0], argv[++i]);
    } else if (arg == "--prefetchers" && has_value) {
      args.prefetchers = positive(argv[0], argv[++i]);
    } else if (arg == "--stage-dir" && has_value) {
      args.stage_dir = argv[++i];
    } else if (args.data.empty() && !arg.starts_with("-")) {
      args.data = arg;
    } else {
      usage(argv[0]);
    }
  }
  if (args.data.empty()) usage(argv[0]);
  return args;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  try {
    // Walking the tree once and saving the catalog (Catalog::save / load) spares the PFS later.
    const prestage::Catalog catalog = prestage::Catalog::from_folder(args.data);

    prestage::LoaderOptions options;
    options.batch_size = args.batch_size;
    options.image_size = {args.height, args.width};
    options.readers = args.readers;
    options.prefetchers = args.prefetchers;
    options.stage_dir = args.stage_dir;  // empty: read the source directly
    prestage::Loader loader(catalog, options);
    std::printf("%zu samples in %zu classes, %llu batches per epoch\n", catalog.size(),
                catalog.classes().size(),
                static_cast<unsigned long long>(loader.batches_per_epoch()));

    for (uint64_t epoch = 0; epoch < args.epochs; ++epoch) {
      const auto start = std::chrono::steady_clock::now();
      uint64_t images = 0;
      int64_t label_sum = 0;  // touch the labels as a trainer would
      loader.start_epoch(epoch);
      // Each Batch is a view of one of the ring's buffers; it goes back to the ring when destroyed.
      while (std::optional<prestage::Batch> batch = loader.next()) {
        const auto shape = batch->shape();
        if (batch->index() < 2 || batch->index() + 1 == loader.batches_per_epoch()) {
          std::printf(
              "epoch %llu batch %llu: images uint8 [%zu, %zu, %zu, %zu] (NHWC), "
              "labels [%zu]%s\n",
              static_cast<unsigned long long>(epoch),
              static_cast<unsigned long long>(batch->index()), shape[0], shape[1], shape[2],
              shape[3], batch->labels().size(), batch->pinned() ? ", pinned" : "");
        }
        for (const int64_t label : batch->labels()) label_sum += label;
        images += batch->size();
      }
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::printf("epoch %llu: %llu images in %.2f s, %.0f images/s (label sum %lld)\n",
                  static_cast<unsigned long long>(epoch), static_cast<unsigned long long>(images),
                  seconds, static_cast<double>(images) / seconds,
                  static_cast<long long>(label_sum));
    }
    const prestage::Stats stats = loader.stats();
    std::printf("consumer stall %.2f s; decode busy %.2f s; stage hits %llu, misses %llu\n",
                stats.consumer_stall_s, stats.decode.busy_s,
                static_cast<unsigned long long>(stats.hits),
                static_cast<unsigned long long>(stats.misses));
  } catch (const prestage::Error& e) {
    // IoError and DecodeError name the sample's path; ConfigError names the option.
    std::fprintf(stderr, "prestage_example: %s\n", e.what());
    return 1;
  }
  return 0;
}
