#include "format/safetensors_shard_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>

#include "core/error.h"

namespace tetra {
namespace {

void pwrite_all(int fd, const uint8_t* data, size_t nbytes, uint64_t offset,
                const std::filesystem::path& path) {
  while (nbytes > 0) {
    const ssize_t n = ::pwrite(fd, data, nbytes, off_t(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      TETRA_FAIL(path.string(), ": write failed at offset ", offset, ": ",
                 n < 0 ? std::strerror(errno) : "no progress");
    data += n;
    nbytes -= size_t(n);
    offset += uint64_t(n);
  }
}

}  // namespace

SafetensorsShardFile::SafetensorsShardFile(std::filesystem::path final_path,
                                           const std::vector<SafetensorsEntry>& entries,
                                           const std::map<std::string, std::string>& metadata)
    : final_path_(std::move(final_path)) {
  partial_path_ = final_path_;
  partial_path_ += ".partial";
  const std::string header = safetensors_header_json(entries, metadata, final_path_.string());
  data_offset_ = 8 + header.size();
  uint64_t data_bytes = 0;
  for (const SafetensorsEntry& e : entries) data_bytes = std::max(data_bytes, e.end);

  fd_ = ::open(partial_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) TETRA_FAIL(partial_path_.string(), ": cannot create: ", std::strerror(errno));
  try {
    uint8_t prefix[8];  // header length, u64 little-endian
    for (int i = 0; i < 8; ++i) prefix[i] = uint8_t(uint64_t(header.size()) >> (8 * i));
    pwrite_all(fd_, prefix, 8, 0, partial_path_);
    pwrite_all(fd_, reinterpret_cast<const uint8_t*>(header.data()), header.size(), 8,
               partial_path_);
    // Reserve the full size now so the file's length is right whatever order tensors arrive in.
    if (::ftruncate(fd_, off_t(data_offset_ + data_bytes)) != 0)
      TETRA_FAIL(partial_path_.string(), ": cannot size to ", data_offset_ + data_bytes,
                 " bytes: ", std::strerror(errno));
  } catch (...) {  // the destructor does not run for a half-built object
    ::close(fd_);
    std::error_code ec;
    std::filesystem::remove(partial_path_, ec);
    throw;
  }
}

SafetensorsShardFile::~SafetensorsShardFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) {
    std::error_code ec;  // best effort: a destructor must not throw
    std::filesystem::remove(partial_path_, ec);
  }
}

void SafetensorsShardFile::write_at(uint64_t begin, const void* data, size_t nbytes) const {
  TETRA_CHECK(fd_ >= 0, "write to a closed shard ", final_path_.string());
  pwrite_all(fd_, static_cast<const uint8_t*>(data), nbytes, data_offset_ + begin, partial_path_);
}

void SafetensorsShardFile::commit() {
  TETRA_CHECK(fd_ >= 0 && !committed_, "shard committed twice: ", final_path_.string());
  if (::fsync(fd_) != 0)
    TETRA_FAIL(partial_path_.string(), ": fsync failed: ", std::strerror(errno));
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0)
    TETRA_FAIL(partial_path_.string(), ": close failed: ", std::strerror(errno));
  std::error_code ec;
  std::filesystem::rename(partial_path_, final_path_, ec);
  if (ec)
    TETRA_FAIL(partial_path_.string(), ": cannot rename to ", final_path_.string(), ": ",
               ec.message());
  committed_ = true;
}

void fsync_directory(const std::filesystem::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) TETRA_FAIL(dir.string(), ": cannot open directory: ", std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // Some file systems cannot fsync a directory (EINVAL): nothing more can be done there.
  if (rc != 0 && err != EINVAL) TETRA_FAIL(dir.string(), ": fsync failed: ", std::strerror(err));
}

}  // namespace tetra
