// launch_site: the kernel lookup of an op's eager call, made from the launch's own arguments.
//
// An op's plan picks its kernel by a key of the arguments (`(input.dtype, weight.numel())`) and
// launches `table[key](*args)`. Reading those attributes from Python costs more than the rest of
// the call's Python together; a site reads them from the tensors tvm-ffi has already converted
// for the launch. `make(rule)` returns two functions:
//
//   call(*args)          the kernel remembered for the arguments' key, called with `args` (its
//                        result: None or a bool); or, for a key not remembered (or an argument
//                        the rule names that is not a tensor), the int -1 without a launch.
//   remember(fn, *args)  remember `fn` for the key of `args` (`fn` is the table's kernel for it).
//   forget()             drop every kernel remembered (the table they came from changed).
//
// `rule` is a flat list of (argument index, attribute, dimension) triples: attribute 0 is the
// tensor's dtype, 1 its number of elements, 2 its size in `dimension` (negative from the end).
// The Python table stays the one source of the kernels: a site holds only functions it was given.
//
// Calls release the GIL, so calls of one site may run at once in several threads: each change
// publishes a new immutable list of entries, and every list stays alive with the site.
#pragma once

#include <sgl_kernel/utils.h>

#include <dlpack/dlpack.h>
#include <tvm/ffi/any.h>
#include <tvm/ffi/c_api.h>
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/function.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

namespace jit_kernel::launch_site {

inline constexpr int kMaxKeyParts = 4;
// Enough for every dtype and width one call site meets; past it, a key is served by the table.
inline constexpr std::size_t kMaxEntries = 64;
inline constexpr int64_t kMissed = -1;

using Key = std::array<int64_t, kMaxKeyParts>;

struct Part {
  int32_t index;
  int32_t attribute;  // 0 dtype, 1 numel, 2 size(dimension)
  int32_t dimension;
};

struct Entry {
  Key key;
  tvm::ffi::Function kernel;
};

class Site {
 public:
  explicit Site(std::vector<Part> parts) : parts_(std::move(parts)) {
    publish(std::vector<Entry>{});
  }

  /// The key of `args`; none where an argument the rule names is missing or not a tensor.
  std::optional<Key> key_of(const tvm::ffi::AnyView* args, int32_t num_args) const {
    Key key{};
    for (std::size_t i = 0; i < parts_.size(); ++i) {
      const auto& part = parts_[i];
      if (part.index >= num_args) return std::nullopt;
      const TVMFFIAny* raw = reinterpret_cast<const TVMFFIAny*>(args + part.index);
      const DLTensor* tensor = nullptr;
      if (raw->type_index == tvm::ffi::TypeIndex::kTVMFFITensor) {
        tensor = TVMFFITensorGetDLTensorPtr(raw->v_obj);
      } else if (raw->type_index == tvm::ffi::TypeIndex::kTVMFFIDLTensorPtr) {
        tensor = static_cast<const DLTensor*>(raw->v_ptr);
      } else {
        return std::nullopt;
      }
      if (part.attribute == 0) {
        const auto& t = tensor->dtype;
        key[i] = int64_t{t.code} | (int64_t{t.bits} << 8) | (int64_t{t.lanes} << 16);
      } else if (part.attribute == 1) {
        int64_t numel = 1;
        for (int d = 0; d < tensor->ndim; ++d) numel *= tensor->shape[d];
        key[i] = numel;
      } else {
        const int d = part.dimension < 0 ? tensor->ndim + part.dimension : part.dimension;
        if (d < 0 || d >= tensor->ndim) return std::nullopt;
        key[i] = tensor->shape[d];
      }
    }
    return key;
  }

  void call(tvm::ffi::PackedArgs args, tvm::ffi::Any* result) const {
    if (const auto key = key_of(args.data(), args.size())) {
      const auto* entries = entries_.load(std::memory_order_acquire);
      for (const auto& entry : *entries) {
        if (entry.key == *key) {
          entry.kernel.CallPacked(args, result);
          // An int is the miss: a launcher returning one would be launched again by the caller.
          host::RuntimeCheck(
              result->type_index() != tvm::ffi::TypeIndex::kTVMFFIInt,
              "launch_site: a launcher called through a site returns None or a bool, got an int");
          return;
        }
      }
    }
    *result = kMissed;
  }

  void remember(tvm::ffi::PackedArgs args) {
    const auto kernel = args[0].cast<tvm::ffi::Function>();
    const auto key = key_of(args.data() + 1, args.size() - 1);
    if (!key) return;
    std::lock_guard lock(mutex_);
    const auto& current = *entries_.load(std::memory_order_relaxed);
    if (current.size() >= kMaxEntries) return;
    for (const auto& entry : current) {
      if (entry.key == *key) return;
    }
    auto next = current;
    next.push_back(Entry{*key, kernel});
    publish(std::move(next));
  }

  void forget() {
    std::lock_guard lock(mutex_);
    publish(std::vector<Entry>{});
  }

 private:
  void publish(std::vector<Entry> entries) {
    lists_.push_back(std::make_unique<const std::vector<Entry>>(std::move(entries)));
    entries_.store(lists_.back().get(), std::memory_order_release);
  }

  std::vector<Part> parts_;
  std::mutex mutex_;
  std::vector<std::unique_ptr<const std::vector<Entry>>> lists_;  // every list published, kept alive
  std::atomic<const std::vector<Entry>*> entries_{nullptr};
};

inline tvm::ffi::Array<tvm::ffi::Function> make(tvm::ffi::Array<int64_t> rule) {
  using namespace host;
  RuntimeCheck(
      rule.size() % 3 == 0 && rule.size() / 3 <= kMaxKeyParts && !rule.empty(),
      "launch_site: rule must hold 1 to ",
      kMaxKeyParts,
      " (index, attribute, dimension) triples, got ",
      rule.size(),
      " values");
  std::vector<Part> parts;
  for (std::size_t i = 0; i < rule.size(); i += 3) {
    const auto attribute = rule[i + 1];
    RuntimeCheck(
        rule[i] >= 0 && attribute >= 0 && attribute <= 2,
        "launch_site: rule triple ",
        i / 3,
        " names argument ",
        rule[i],
        " and attribute ",
        attribute);
    parts.push_back(
        Part{static_cast<int32_t>(rule[i]), static_cast<int32_t>(attribute), static_cast<int32_t>(rule[i + 2])});
  }
  auto site = std::make_shared<Site>(std::move(parts));
  return {
      tvm::ffi::Function::FromPacked(
          [site](tvm::ffi::PackedArgs args, tvm::ffi::Any* result) { site->call(args, result); }),
      tvm::ffi::Function::FromPacked([site](tvm::ffi::PackedArgs args, tvm::ffi::Any*) { site->remember(args); }),
      tvm::ffi::Function::FromPacked([site](tvm::ffi::PackedArgs, tvm::ffi::Any*) { site->forget(); }),
  };
}

}  // namespace jit_kernel::launch_site
