// The emulated NPU as a PyTorch device: PrivateUse1 (renamed `npu` by the Python side) with host memory behind it.
//
// torch_npu registers the same things in C++: an allocator for the card's memory, a device guard, the PrivateUse1
// hooks, and kernels. Here the card's memory is host memory counted against a configured capacity per card, so a
// tensor on `npu` is a real device tensor to every check torch makes (device type, dispatch key, pinned host
// memory, cross-device copies through `_copy_from`), and its kernels are the CPU's: a boxed fallback runs any op on
// host aliases of its `npu` arguments (CPU tensors over the same memory, no copy) and hands back `npu` tensors.
// An op given a non-scalar CPU tensor next to `npu` ones is refused as a card refuses it (indices excepted, as on
// CUDA). Statistics (allocated, peak, capacity) are what the card's caching allocator would report without caching.
//
// Ops (namespace npu_emu): configure, memory_stats, reset_peak, set_device, current_device, host_alias, is_pinned.

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_cpu_dispatch.h>
#include <ATen/ops/copy_native.h>
#include <ATen/ops/set_cpu_dispatch.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/view_native.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/library.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace {

constexpr c10::DeviceType kNpu = c10::DeviceType::PrivateUse1;

struct Card {
  int64_t capacity = 1LL << 30;
  int64_t allocated = 0;
  int64_t peak = 0;
  int64_t allocations = 0;
  int64_t frees = 0;
};

std::mutex g_mutex;
std::vector<Card> g_cards(8);
std::atomic<int> g_current{0};  // one process drives one card (a worker per card), as vLLM's workers do

int card_count() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return static_cast<int>(g_cards.size());
}

int checked_index(int64_t index) {
  const int count = card_count();
  TORCH_CHECK(index >= 0 && index < count, "emulated NPU: device index ", index, " outside 0..", count - 1);
  return static_cast<int>(index);
}

// Counts `nbytes` on card `index`; more than the card holds is the card's out-of-memory error.
void reserve(int index, size_t nbytes) {
  std::lock_guard<std::mutex> lock(g_mutex);
  Card& card = g_cards.at(index);
  const int64_t wanted = card.allocated + static_cast<int64_t>(nbytes);
  TORCH_CHECK_WITH(OutOfMemoryError, wanted <= card.capacity, "emulated NPU out of memory: tried to allocate ",
                   nbytes, " bytes on npu:", index, " with ", card.allocated, " of ", card.capacity,
                   " bytes in use (ASCEND_TESTKIT_NPU_MEMORY)");
  card.allocated = wanted;
  card.peak = std::max(card.peak, wanted);
  card.allocations += 1;
}

void release(int index, size_t nbytes) {
  std::lock_guard<std::mutex> lock(g_mutex);
  Card& card = g_cards.at(index);
  card.allocated -= static_cast<int64_t>(nbytes);
  card.frees += 1;
}

struct Block {
  void* data;
  size_t nbytes;
  int index;
  c10::Storage adopted;  // set when the block is a CPU kernel's fresh output handed to the card (no copy)
};

void free_block(void* ctx) {
  auto* block = static_cast<Block*>(ctx);
  release(block->index, block->nbytes);
  if (!block->adopted && block->data != nullptr) {
    c10::free_cpu(block->data);
  }
  delete block;
}

struct NpuAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    const int index = g_current.load();
    reserve(index, nbytes);
    void* data = nbytes ? c10::alloc_cpu(nbytes) : nullptr;
    return {data, new Block{data, nbytes, index, {}}, &free_block, c10::Device(kNpu, index)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const final { std::memcpy(dest, src, count); }
};

NpuAllocator g_allocator;

// Pinned host memory, as torch_npu's host allocator gives it: host pages the card can copy from asynchronously.
std::mutex g_pinned_mutex;
std::unordered_set<const void*> g_pinned;

void free_pinned(void* data) {
  {
    std::lock_guard<std::mutex> lock(g_pinned_mutex);
    g_pinned.erase(data);
  }
  c10::free_cpu(data);
}

struct PinnedAllocator final : at::HostAllocator {
  c10::DataPtr allocate(size_t nbytes) override {
    void* data = nbytes ? c10::alloc_cpu(nbytes) : nullptr;
    if (data != nullptr) {
      std::lock_guard<std::mutex> lock(g_pinned_mutex);
      g_pinned.insert(data);
    }
    return {data, data, &free_pinned, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_pinned; }
  void copy_data(void* dest, const void* src, std::size_t count) const final { std::memcpy(dest, src, count); }
  // Copies are synchronous: a block is free for reuse as soon as it is released, so there is nothing to track.
  bool record_event(void*, void*, c10::Stream) override { return true; }
  void empty_cache() override {}
  at::HostStats get_stats() override { return {}; }
  void reset_accumulated_stats() override {}
  void reset_peak_stats() override {}
};

PinnedAllocator g_pinned_allocator;

struct NpuGuard final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kNpu; }
  c10::Device exchangeDevice(c10::Device d) const override {
    const auto old = getDevice();
    setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(kNpu, g_current.load()); }
  void setDevice(c10::Device d) const override {
    if (d.has_index()) g_current.store(checked_index(d.index()));
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.has_index()) g_current.store(d.index());
  }
  c10::Stream getStream(c10::Device d) const override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream exchangeStream(c10::Stream s) const override { return c10::Stream(c10::Stream::DEFAULT, s.device()); }
  c10::DeviceIndex deviceCount() const noexcept override { return static_cast<c10::DeviceIndex>(card_count()); }
  // Work runs synchronously on the host: every event has happened, every stream is idle.
  void record(void**, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeDevice(const c10::DeviceIndex) const override {}
};

struct NpuHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return card_count() > 0; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return static_cast<c10::DeviceIndex>(card_count()); }
  void setCurrentDevice(c10::DeviceIndex d) const override { g_current.store(checked_index(d)); }
  c10::DeviceIndex getCurrentDevice() const override { return static_cast<c10::DeviceIndex>(g_current.load()); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    const auto old = getCurrentDevice();
    setCurrentDevice(d);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override { return exchangeDevice(d); }
  bool isPinnedPtr(const void* data) const override {
    std::lock_guard<std::mutex> lock(g_pinned_mutex);
    return g_pinned.count(data) > 0;
  }
  c10::Allocator* getPinnedMemoryAllocator() const override { return &g_pinned_allocator; }
  c10::Device getDeviceFromPtr(void*) const override { return c10::Device(kNpu, g_current.load()); }
  // The card's kernels are the host's: random ops on `npu` draw from the CPU generator (torch.manual_seed seeds it).
  const at::Generator& getDefaultGenerator(c10::DeviceIndex) const override {
    return at::detail::getDefaultCPUGenerator();
  }
  at::Generator getNewGenerator(c10::DeviceIndex) const override { return at::detail::createCPUGenerator(); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    at::native::resize_bytes_cpu(storage.unsafeGetStorageImpl(), newsize);
  }
};

// ---- host aliases -------------------------------------------------------------------------------------------------

void drop_storage_ref(void* ctx) { delete static_cast<c10::Storage*>(ctx); }

// A CPU storage over an `npu` storage's memory; it keeps the card's storage alive. A CPU kernel may resize it (an
// out= argument): the new memory then comes from the card's allocator, and `Aliases::sync` hands it to the card's
// storage.
c10::Storage host_storage(const c10::Storage& npu) {
  c10::DataPtr ptr(npu.mutable_data(), new c10::Storage(npu), &drop_storage_ref, c10::Device(c10::kCPU));
  return c10::Storage(c10::Storage::use_byte_size_t(), npu.nbytes(), std::move(ptr), &g_allocator, true);
}

at::Tensor tensor_on(c10::Storage storage, c10::DispatchKey key, const at::Tensor& like) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(key), like.dtype());
  impl->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  return at::Tensor(std::move(impl));
}

at::Tensor host_alias(const at::Tensor& t) {
  if (!t.defined() || t.device().type() != kNpu) return t;
  return tensor_on(host_storage(t.storage()), c10::DispatchKey::CPU, t);
}

// A CPU kernel's fresh output, handed to the card without a copy; counted on the card like any allocation.
at::Tensor adopt(const at::Tensor& cpu, int index) {
  c10::Storage source = cpu.storage();
  const size_t nbytes = source.nbytes();
  reserve(index, nbytes);
  void* data = source.mutable_data();
  c10::DataPtr ptr(data, new Block{data, nbytes, index, source}, &free_block, c10::Device(kNpu, index));
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, std::move(ptr), &g_allocator, true);
  return tensor_on(std::move(storage), c10::DispatchKey::PrivateUse1, cpu);
}

// ---- the boxed fallback -------------------------------------------------------------------------------------------

struct Aliases {
  // host storage impl -> the card's storage it aliases; the input tensors given to the kernel, by host impl
  std::unordered_map<const c10::StorageImpl*, c10::Storage> storages;
  std::unordered_map<const c10::StorageImpl*, c10::Storage> host_of;  // card storage impl -> its host storage
  std::unordered_map<const c10::TensorImpl*, at::Tensor> inputs;      // host alias impl -> the card's tensor
  std::vector<std::pair<at::Tensor, at::Tensor>> pairs;                // (the card's tensor, its host alias)
  int index = -1;

  // After the kernel: out= arguments it resized take their new memory and shape back to the card's tensors.
  void sync() {
    for (auto& [card, host] : pairs) {
      c10::StorageImpl* card_storage = card.storage().unsafeGetStorageImpl();
      c10::StorageImpl* host_storage_impl = host.storage().unsafeGetStorageImpl();
      if (host_storage_impl->data() != card_storage->data() && host_storage_impl->nbytes() > 0) {
        const size_t nbytes = host_storage_impl->nbytes();
        card_storage->set_data_ptr_noswap(std::move(host_storage_impl->mutable_data_ptr()));
        card_storage->set_nbytes(nbytes);
        host_storage_impl->set_data_ptr_noswap(c10::DataPtr(card_storage->mutable_data(), c10::Device(c10::kCPU)));
      }
      if (card.sizes() != host.sizes() || card.strides() != host.strides() ||
          card.storage_offset() != host.storage_offset()) {
        card.unsafeGetTensorImpl()->set_sizes_and_strides(host.sizes(), host.strides(), host.storage_offset());
      }
    }
  }

  at::Tensor alias(const at::Tensor& t) {
    if (!t.defined() || t.device().type() != kNpu) return t;
    index = t.device().index();
    const c10::StorageImpl* key = t.storage().unsafeGetStorageImpl();
    auto found = host_of.find(key);
    if (found == host_of.end()) {
      c10::Storage host = host_storage(t.storage());
      storages.emplace(host.unsafeGetStorageImpl(), t.storage());
      found = host_of.emplace(key, std::move(host)).first;
    }
    at::Tensor h = tensor_on(found->second, c10::DispatchKey::CPU, t);
    inputs.emplace(h.unsafeGetTensorImpl(), t);
    pairs.emplace_back(t, h);
    return h;
  }

  at::Tensor back(const at::Tensor& out, bool to_card) {
    if (!out.defined() || out.device().type() != c10::kCPU) return out;
    auto same = inputs.find(out.unsafeGetTensorImpl());
    if (same != inputs.end()) return same->second;  // in place / out=: the caller's own tensor
    auto aliased = storages.find(out.storage().unsafeGetStorageImpl());
    if (aliased != storages.end()) return tensor_on(aliased->second, c10::DispatchKey::PrivateUse1, out);  // a view
    return to_card ? adopt(out, index) : out;
  }
};

bool is_index_argument(const c10::OperatorName& name, const std::string& argument) {
  static const std::unordered_set<std::string> index_ops = {
      "aten::index", "aten::index_put_", "aten::index_put", "aten::_index_put_impl_", "aten::_unsafe_index",
      "aten::_unsafe_index_put"};
  return argument == "indices" && index_ops.count(name.name) > 0;
}

void refuse_host_tensor(const c10::OperatorHandle& op, const std::string& argument, const at::Tensor& t) {
  // A 0-dim CPU tensor is a scalar to a device kernel (TensorIterator takes it); anything else is on the wrong device.
  if (!t.defined() || t.device().type() != c10::kCPU || t.dim() == 0) return;
  if (is_index_argument(op.schema().operator_name(), argument)) return;
  TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, npu and cpu! (",
              op.schema().operator_name(), " argument '", argument, "' is on the host; emulated NPU)");
}

void npu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t num_arguments = schema.arguments().size();
  const size_t first = stack->size() - num_arguments;
  Aliases aliases;
  bool device_argument_set = false;
  for (size_t i = 0; i < num_arguments; ++i) {
    c10::IValue& value = (*stack)[first + i];
    const std::string& name = schema.arguments()[i].name();
    if (value.isTensor()) {
      refuse_host_tensor(op, name, value.toTensor());
      value = aliases.alias(value.toTensor());
    } else if (value.isTensorList()) {
      auto list = value.toTensorList();
      for (size_t j = 0; j < list.size(); ++j) {
        refuse_host_tensor(op, name, list.get(j));
        list.set(j, aliases.alias(list.get(j)));
      }
    } else if (value.isList() && value.toListRef().size() > 0 && !value.isIntList() && !value.isDoubleList() &&
               !value.isBoolList()) {
      auto list = value.toList();
      for (size_t j = 0; j < list.size(); ++j) {
        c10::IValue element = list.get(j);
        if (element.isTensor()) {
          refuse_host_tensor(op, name, element.toTensor());
          list.set(j, aliases.alias(element.toTensor()));
        }
      }
    } else if (value.isDevice()) {
      device_argument_set = true;  // the op says where its output goes: leave its outputs where the kernel put them
    }
  }
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  aliases.sync();
  const size_t num_returns = schema.returns().size();
  const size_t first_return = stack->size() - num_returns;
  const bool to_card = !device_argument_set && aliases.index >= 0;
  for (size_t i = 0; i < num_returns; ++i) {
    c10::IValue& value = (*stack)[first_return + i];
    if (value.isTensor()) {
      value = aliases.back(value.toTensor(), to_card);
    } else if (value.isTensorList()) {
      auto list = value.toTensorList();
      for (size_t j = 0; j < list.size(); ++j) list.set(j, aliases.back(list.get(j), to_card));
    }
  }
}

// ---- kernels the fallback cannot be ------------------------------------------------------------------------------

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory, std::optional<c10::MemoryFormat> memory_format) {
  const auto where = c10::device_or_default(device);
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided, "emulated NPU: strided tensors only");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "Only dense CPU tensors can be pinned");
  const c10::DeviceGuard guard(where);
  return at::detail::empty_generic(size, &g_allocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                         std::optional<bool> pin_memory) {
  const auto where = c10::device_or_default(device);
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided, "emulated NPU: strided tensors only");
  const c10::DeviceGuard guard(where);
  return at::detail::empty_strided_generic(size, stride, &g_allocator,
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

at::Tensor as_strided(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                      std::optional<c10::SymInt> storage_offset) {
  return at::cpu::as_strided_symint(self, size, stride, std::move(storage_offset));
}

at::Tensor view(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

at::Tensor reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride));
}

const at::Tensor& resize(const at::Tensor& self, c10::SymIntArrayRef size,
                         std::optional<at::MemoryFormat> memory_format) {
  return at::native::resize_(self, C10_AS_INTARRAYREF_SLOW(size), memory_format);
}

// Copies between the host and the card, or on the card: a memcpy-like CPU copy between host aliases.
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  at::Tensor target = host_alias(dst);
  at::native::copy_(target, host_alias(self), non_blocking);
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  at::native::resize_(dst, self.sizes(), std::nullopt);
  return copy_from(self, dst, false);
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  return at::native::set_tensor_(self, source);
}

at::Tensor& set_source_storage(at::Tensor& self, c10::Storage source) { return at::native::set_(self, source); }

at::Tensor& set_source_storage_offset(at::Tensor& self, c10::Storage source, c10::SymInt offset,
                                      c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  return at::cpu::set__symint(self, source, offset, size, stride);
}

// ---- npu_emu ops (the Python side of the runtime) ------------------------------------------------------------------

void configure(int64_t count, int64_t capacity) {
  std::lock_guard<std::mutex> lock(g_mutex);
  TORCH_CHECK(count >= 1 && capacity > 0, "emulated NPU: give a positive card count and capacity");
  for (const Card& card : g_cards) {
    TORCH_CHECK(card.allocated == 0, "emulated NPU: configure() before anything is allocated on a card");
  }
  g_cards.assign(count, Card{});
  for (Card& card : g_cards) card.capacity = capacity;
}

// [allocated, peak, capacity, allocations, frees] of card `index`.
std::vector<int64_t> memory_stats(int64_t index) {
  checked_index(index);
  std::lock_guard<std::mutex> lock(g_mutex);
  const Card& card = g_cards.at(index);
  return {card.allocated, card.peak, card.capacity, card.allocations, card.frees};
}

void reset_peak(int64_t index) {
  checked_index(index);
  std::lock_guard<std::mutex> lock(g_mutex);
  g_cards.at(index).peak = g_cards.at(index).allocated;
}

void set_device(int64_t index) { g_current.store(checked_index(index)); }

int64_t current_device() { return g_current.load(); }

// A CPU tensor over an `npu` tensor's memory (what HCCL-over-gloo and the graph recorder hand the host).
at::Tensor host_alias_op(const at::Tensor& t) {
  TORCH_CHECK(t.device().type() == kNpu, "host_alias takes an npu tensor, got one on ", t.device());
  return host_alias(t);
}

bool is_pinned_host(const at::Tensor& t) {
  std::lock_guard<std::mutex> lock(g_pinned_mutex);
  return t.device().type() == c10::kCPU && g_pinned.count(t.storage().data()) > 0;
}

struct Registration {
  Registration() { at::RegisterPrivateUse1HooksInterface(new NpuHooks()); }
};
Registration g_registration;

}  // namespace

C10_REGISTER_GUARD_IMPL(PrivateUse1, NpuGuard);
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_allocator);
REGISTER_HOST_ALLOCATOR(at::kPrivateUse1, &g_pinned_allocator);

TORCH_LIBRARY(npu_emu, m) {
  m.def("configure(int count, int capacity) -> ()", &configure);
  m.def("memory_stats(int index) -> int[]", &memory_stats);
  m.def("reset_peak(int index) -> ()", &reset_peak);
  m.def("set_device(int index) -> ()", &set_device);
  m.def("current_device() -> int", &current_device);
  m.def("is_pinned_host(Tensor t) -> bool", &is_pinned_host);
  m.def("host_alias(Tensor t) -> Tensor");
}

TORCH_LIBRARY_IMPL(npu_emu, PrivateUse1, m) { m.impl("host_alias", &host_alias_op); }

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", &empty_memory_format);
  m.impl("empty_strided", &empty_strided);
  m.impl("as_strided", &as_strided);
  m.impl("view", &view);
  m.impl("_reshape_alias", &reshape_alias);
  m.impl("resize_", &resize);
  m.impl("_copy_from", &copy_from);
  m.impl("_copy_from_and_resize", &copy_from_and_resize);
  m.impl("set_.source_Tensor", &set_source_tensor);
  m.impl("set_.source_Storage", &set_source_storage);
  m.impl("set_.source_Storage_storage_offset", &set_source_storage_offset);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&npu_fallback>()); }
