// Directories and files that belong to the job's user on a node shared with other users (a stage
// directory under /tmp, say): made with modes that let no one else in, refused when someone else
// made them first, and reached only through a directory descriptor checked once, so that a path
// followed through a link another user planted never leads a write out of them.
#pragma once

#include <sys/types.h>

#include <string>

#include "prestage/error.hpp"

namespace prestage::detail {

// A directory or file found that this process must not trust (owned by another user, writable by
// others, a symbolic link): an IoError (EPERM or EACCES; ELOOP for a link) whose message names the
// path, its owner and mode, and what to do. A loader never falls back from it to reading the
// source: the job asked for staging.
class UnsafePath : public IoError {
 public:
  using IoError::IoError;
};

// Who may use what is made: the job's user alone (dirs 0700, files 0600), or also the members of
// one group (stage_group: dirs 02770 of that group, files 0660), whatever the umask.
struct StageAccess {
  static constexpr gid_t kNoGroup = static_cast<gid_t>(-1);
  gid_t group = kNoGroup;
  bool shared() const noexcept { return group != kNoGroup; }
  mode_t dir_mode() const noexcept { return shared() ? 02770 : 0700; }
  mode_t file_mode() const noexcept { return shared() ? 0660 : 0600; }
  // The job's user alone (empty), or the group of that name (ConfigError if there is none).
  static StageAccess of(const std::string& group_name);
};

// A descriptor, closed when this is destroyed.
class UniqueFd {
 public:
  explicit UniqueFd(int fd = -1) noexcept : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = other.release();
    }
    return *this;
  }
  int get() const noexcept { return fd_; }
  int release() noexcept {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset() noexcept;

 private:
  int fd_;
};

// The directory `path`, created (with its missing parents, each `access.dir_mode()`) if absent and
// opened as it is named (links followed: the caller's own path). It may be shared, as /tmp is
// (mode 1777): a directory that others can write but whose sticky bit is not set is refused
// (UnsafePath), as another user could then rename what is in it and put their own in its place.
UniqueFd open_parent_dir(const std::string& path, const StageAccess& access);

// Directory `name` in `parent` (a descriptor), created with access.dir_mode() if absent, opened
// with O_DIRECTORY | O_NOFOLLOW and checked once: a real directory, owned by this process's user
// (shared: or of the group, by any user), and not open to others (no "other" bits; private: no
// group write either). One of this user's that grants read or search beyond `access` (made by
// an older version, or under another umask) is tightened; one that grants write beyond it, or
// belongs to another user, is refused (UnsafePath naming `shown`, its owner and mode). `*created`:
// whether this call made it. Throws IoError when it cannot be made or opened (EROFS...).
UniqueFd open_private_dir(int parent, const std::string& name, const std::string& shown,
                          const StageAccess& access, bool* created = nullptr);

// File `name` in the checked directory `dir`, opened with `flags` | O_NOFOLLOW | O_CLOEXEC (and
// access.file_mode() when O_CREAT creates it, whatever the umask). A link is refused (UnsafePath,
// ELOOP, naming `shown`), as is anything but a regular file, without waiting on it (a FIFO: opened
// without blocking, then refused; one opened only to write fails with ENXIO). Returns -1 with errno
// set when it cannot be opened for any other reason, as open() does.
int open_in(int dir, const char* name, int flags, const std::string& shown,
            const StageAccess& access);

}  // namespace prestage::detail
