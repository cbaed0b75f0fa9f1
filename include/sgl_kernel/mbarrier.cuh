/// \file mbarrier.cuh
/// \brief Shared-memory barriers (`mbarrier`) and the bulk-copy engine (`cp.async.bulk`, the 1-D
/// form of TMA): what a producer/consumer copy kernel needs on sm_90+.
///
/// The pattern, one stage of a ring:
///
/// \code
///   // one thread, once:        mbar_init(&full[s], 1); mbar_init(&empty[s], consumers); fence_mbarrier_init();
///   // producer (one thread):   mbar_wait_parity(&empty[s], phase ^ 1);
///   //                          mbar_arrive_expect_tx(&full[s], bytes);
///   //                          bulk_g2s(stage[s], src, bytes, &full[s]);
///   // consumers:               mbar_wait_parity(&full[s], phase);  ... read stage[s] ...
///   //                          mbar_arrive(&empty[s]);            // or bulk_s2g + wait_group_read first
/// \endcode
///
/// Phases. After `mbar_init` a barrier is in phase 0; each time its arrivals (and its expected
/// transaction bytes) complete, the phase flips. `mbar_wait_parity(bar, p)` returns once the phase
/// with parity `p` has completed. A consumer of a stage filled by someone else starts waiting on
/// parity 0; a producer waiting for a slot that nobody has used yet starts on parity 1, which
/// counts as completed, so its first wait returns at once. Flip the parity each time the ring wraps.
///
/// Memory order. `mbar_wait_parity` acquires: bytes a bulk copy delivered to shared memory under
/// that barrier are visible to the waiting thread's ordinary loads. The wrappers clobber memory, so
/// the compiler does not move shared-memory accesses across them.
///
/// Alignment. Bulk copies need 16-byte aligned addresses on both sides and a size that is a
/// multiple of 16 bytes. Global addresses may be device memory or page-locked host memory (through
/// its device alias, `host::runtime::get_device_accessible_ptr`).
///
/// Arch guard. Everything except `to_shared` needs sm_90. In a device pass for an older arch the
/// functions are declared deleted: a kernel that uses them must guard its body (for example with
/// `#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900`, or `SGL_ARCH_HOPPER_OR_GREATER` for a
/// build whose every arch is sm_90+), and one that does not fails to compile for that arch
/// ("cannot be referenced -- it is a deleted function") rather than fault at run time.
///
/// The functions live in `device::ptx`, and are visible as `sglang::device::ptx::...` too
/// (sglang's spelling, 0.5.23 on).

#pragma once

#include <sgl_kernel/utils.cuh>

#include <cstdint>

namespace device::ptx {

/// \brief The 32-bit shared-window address of a generic pointer to shared memory, as the
/// `.shared` operands of inline PTX take it.
template <typename T>
SGL_DEVICE auto to_shared(T* ptr) -> uint32_t {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ < 900)

// sm_89 and older: no parity waits, transaction counts or bulk copies. Deleted, so that a kernel
// using them without an arch guard fails to compile for this arch (see the file comment).
SGL_DEVICE void mbar_init(uint64_t* bar, uint32_t count) = delete;
SGL_DEVICE void fence_mbarrier_init() = delete;
SGL_DEVICE auto mbar_arrive(uint64_t* bar) -> uint64_t = delete;
SGL_DEVICE auto mbar_arrive_relaxed(uint64_t* bar) -> uint64_t = delete;
SGL_DEVICE void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) = delete;
SGL_DEVICE void mbar_expect_tx(uint64_t* bar, uint32_t bytes) = delete;
SGL_DEVICE auto mbar_try_wait_parity(uint64_t* bar, uint32_t parity) -> bool = delete;
SGL_DEVICE void mbar_wait_parity(uint64_t* bar, uint32_t parity) = delete;
SGL_DEVICE void fence_proxy_async_shared() = delete;
SGL_DEVICE void bulk_g2s(void* dst_smem, const void* src, uint32_t bytes, uint64_t* bar) = delete;
SGL_DEVICE void bulk_s2g(void* dst, const void* src_smem, uint32_t bytes) = delete;
SGL_DEVICE void bulk_commit_group() = delete;
template <int kPending = 0>
SGL_DEVICE void bulk_wait_group() = delete;
template <int kPending = 0>
SGL_DEVICE void bulk_wait_group_read() = delete;
SGL_DEVICE void bulk_prefetch_l2(const void* src, uint32_t bytes) = delete;

#else

// ---- mbarrier ---------------------------------------------------------------------------------

/// \brief Initialise `bar` (8-byte aligned, in shared memory) to expect `count` arrivals per phase.
/// One thread; follow with `fence_mbarrier_init()` and a `__syncthreads()` before other threads use it.
SGL_DEVICE void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(to_shared(bar)), "r"(count) : "memory");
}

/// \brief Makes barrier initialisations visible to the async proxy (bulk copies that complete on
/// them) and to the other threads of the cluster.
SGL_DEVICE void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

/// \brief One arrival (release). Returns the barrier state token, which parity waits do not need.
SGL_DEVICE auto mbar_arrive(uint64_t* bar) -> uint64_t {
  uint64_t state;
  asm volatile("mbarrier.arrive.shared::cta.b64 %0, [%1];" : "=l"(state) : "r"(to_shared(bar)) : "memory");
  return state;
}

/// \brief One arrival with relaxed order: it counts, and publishes none of this thread's writes.
SGL_DEVICE auto mbar_arrive_relaxed(uint64_t* bar) -> uint64_t {
  uint64_t state;
  asm volatile("mbarrier.arrive.relaxed.cta.shared::cta.b64 %0, [%1];" : "=l"(state) : "r"(to_shared(bar)) : "memory");
  return state;
}

/// \brief One arrival that also expects `bytes` more transaction bytes (a bulk copy's
/// `complete_tx`) before the phase completes. Issue it before the copies it accounts for.
SGL_DEVICE void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(to_shared(bar)), "r"(bytes) : "memory");
}

/// \brief Expect `bytes` more transaction bytes in the current phase, without arriving.
SGL_DEVICE void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(to_shared(bar)), "r"(bytes) : "memory");
}

/// \brief Whether the phase of parity `parity` has completed (acquire); may return false spuriously.
SGL_DEVICE auto mbar_try_wait_parity(uint64_t* bar, uint32_t parity) -> bool {
  uint32_t done;
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
      "selp.u32 %0, 1, 0, p;\n\t}"
      : "=r"(done)
      : "r"(to_shared(bar)), "r"(parity)
      : "memory");
  return done != 0;
}

/// \brief Blocks until the phase of parity `parity` has completed (acquire).
SGL_DEVICE void mbar_wait_parity(uint64_t* bar, uint32_t parity) {
  while (!mbar_try_wait_parity(bar, parity)) {
  }
}

/// \brief Orders this thread's earlier ordinary shared-memory writes before later bulk copies
/// that read them (the generic and async proxies are otherwise unordered).
SGL_DEVICE void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// ---- bulk copies (cp.async.bulk) --------------------------------------------------------------

/// \brief Copies `bytes` from global `src` into this block's shared memory at `dst_smem`; the bytes
/// count against `bar`'s expected transactions (see `mbar_arrive_expect_tx`).
SGL_DEVICE void bulk_g2s(void* dst_smem, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   to_shared(dst_smem)),
               "l"(src),
               "r"(bytes),
               "r"(to_shared(bar))
               : "memory");
}

/// \brief Copies `bytes` from this block's shared memory at `src_smem` to global `dst`, in the
/// issuing thread's current bulk group (close it with `bulk_commit_group`).
SGL_DEVICE void bulk_s2g(void* dst, const void* src_smem, uint32_t bytes) {
  asm volatile(
      "cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(to_shared(src_smem)), "r"(bytes)
      : "memory");
}

/// \brief Closes the issuing thread's current bulk group.
SGL_DEVICE void bulk_commit_group() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

/// \brief Waits until at most `kPending` of this thread's committed bulk groups are unfinished
/// (their writes done and visible).
template <int kPending = 0>
SGL_DEVICE void bulk_wait_group() {
  static_assert(kPending >= 0 && kPending <= 7, "bulk_wait_group: kPending must be in [0, 7]");
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(kPending) : "memory");
}

/// \brief Waits until at most `kPending` of this thread's committed bulk groups are still reading
/// their shared-memory sources: the others' smem may be reused (their global writes may still run).
template <int kPending = 0>
SGL_DEVICE void bulk_wait_group_read() {
  static_assert(kPending >= 0 && kPending <= 7, "bulk_wait_group_read: kPending must be in [0, 7]");
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kPending) : "memory");
}

/// \brief Hints the L2 cache to fetch `bytes` (a multiple of 16) at global `src` (16-byte aligned).
SGL_DEVICE void bulk_prefetch_l2(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}

#endif

}  // namespace device::ptx

/// sglang (0.5.23 on) spells these `sglang::device::ptx::...` and reopens that namespace to add
/// its own: a real namespace forwarding to `::device::ptx`.
namespace sglang::device::ptx {
using namespace ::device::ptx;
}  // namespace sglang::device::ptx
