#include "format/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "core/error.h"

namespace tetra {
namespace {

// Closes the descriptor on every path out of open(); the mapping outlives it.
struct FdGuard {
  int fd = -1;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  const std::string label = path.string();
  FdGuard fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (fd.fd < 0) TETRA_FAIL(label, ": cannot open: ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0) TETRA_FAIL(label, ": cannot stat: ", std::strerror(errno));
  if (!S_ISREG(st.st_mode)) TETRA_FAIL(label, ": not a regular file");
  const size_t size = size_t(st.st_size);
  if (size < 8)
    TETRA_FAIL(label, ": file is ", size,
               " bytes, too short for a safetensors file (needs an 8-byte header length)");

  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd.fd, 0);
  if (map == MAP_FAILED)
    TETRA_FAIL(label, ": cannot mmap ", size, " bytes: ", std::strerror(errno));

  SafetensorsFile file;  // owns the mapping from here on: unmapped if parsing throws
  file.path_ = path;
  file.base_ = static_cast<const uint8_t*>(map);
  file.size_ = size;
  SafetensorsImage image = parse_safetensors_image(file.base_, size, label);
  file.data_offset_ = image.data_offset;
  file.header_ = std::move(image.header);
  return file;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept
    : path_(std::move(other.path_)),
      base_(std::exchange(other.base_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      data_offset_(std::exchange(other.data_offset_, 0)),
      header_(std::move(other.header_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    base_ = std::exchange(other.base_, nullptr);
    size_ = std::exchange(other.size_, 0);
    data_offset_ = std::exchange(other.data_offset_, 0);
    header_ = std::move(other.header_);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() { release(); }

void SafetensorsFile::release() noexcept {
  if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
  base_ = nullptr;
  size_ = 0;
}

TensorView SafetensorsFile::view(std::string_view name) const {
  const SafetensorsEntry* entry = find(name);
  if (!entry) TETRA_FAIL(path_.string(), ": no tensor named '", name, "'");
  return view(*entry);
}

TensorView SafetensorsFile::view(const SafetensorsEntry& entry) const {
  TensorView v;
  v.name = entry.name;
  v.dtype = entry.dtype;
  v.shape = entry.shape;
  v.data = base_ + data_offset_ + entry.begin;
  v.nbytes = size_t(entry.nbytes());
  return v;
}

}  // namespace tetra
