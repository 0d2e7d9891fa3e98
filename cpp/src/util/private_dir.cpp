#include "util/private_dir.hpp"

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

namespace prestage::detail {

namespace {

[[noreturn]] void fail(const std::string& path, int err, const std::string& action) {
  throw IoError(path, err, "cannot " + action + " '" + path + "': " + std::strerror(err));
}

std::string user_name(uid_t uid) {
  std::vector<char> buf(4096);
  struct passwd pw{};
  struct passwd* found = nullptr;
  if (::getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) == 0 && found != nullptr) {
    return found->pw_name;
  }
  return "?";
}

std::string mode_of(mode_t mode) {
  char text[8];
  std::snprintf(text, sizeof text, "%04o", static_cast<unsigned>(mode & 07777));
  return text;
}

// "owned by uid 1001 (alice), mode 0777"
std::string described(const struct stat& st) {
  return "owned by uid " + std::to_string(st.st_uid) + " (" + user_name(st.st_uid) + "), mode " +
         mode_of(st.st_mode);
}

[[noreturn]] void refuse(const std::string& shown, const struct stat& st, const std::string& why,
                         int err = EPERM) {
  throw UnsafePath(shown, err,
                   "refusing the stage directory '" + shown + "' (" + described(st) + "): " + why +
                       " (this process runs as uid " + std::to_string(::geteuid()) + " (" +
                       user_name(::geteuid()) +
                       ")); give another stage_dir, or remove it if no job of yours uses it");
}

bool in_group(gid_t group) {
  if (::geteuid() == 0 || ::getegid() == group) return true;
  const int n = ::getgroups(0, nullptr);
  if (n <= 0) return false;
  std::vector<gid_t> groups(static_cast<size_t>(n));
  const int got = ::getgroups(n, groups.data());
  for (int i = 0; i < got; ++i) {
    if (groups[static_cast<size_t>(i)] == group) return true;
  }
  return false;
}

// What a directory or file made by this process gets, whatever the umask.
void give_access(int fd, const std::string& shown, mode_t mode, const StageAccess& access) {
  if (access.shared() && ::fchown(fd, static_cast<uid_t>(-1), access.group) != 0) {
    fail(shown, errno, "give the stage group");
  }
  if (::fchmod(fd, mode) != 0) fail(shown, errno, "set the mode of");
}

}  // namespace

void UniqueFd::reset() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

StageAccess StageAccess::of(const std::string& group_name) {
  StageAccess access;
  if (group_name.empty()) return access;
  std::vector<char> buf(1 << 16);
  struct group gr{};
  struct group* found = nullptr;
  if (::getgrnam_r(group_name.c_str(), &gr, buf.data(), buf.size(), &found) != 0 ||
      found == nullptr) {
    throw ConfigError("stage_group: no group named '" + group_name + "' on this node");
  }
  if (!in_group(found->gr_gid)) {
    throw ConfigError("stage_group: this process (uid " + std::to_string(::geteuid()) +
                      ") is not a member of group '" + group_name + "'");
  }
  access.group = found->gr_gid;
  return access;
}

UniqueFd open_parent_dir(const std::string& path, const StageAccess& access) {
  const std::string dir = path.empty() ? "." : path;
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0 && errno == ENOENT) {
    // Made component by component, each with the area's mode: a parent made here is the job's.
    for (size_t at = dir.find('/', 1);; at = dir.find('/', at + 1)) {
      const std::string prefix = dir.substr(0, at);
      if (!prefix.empty() && ::mkdir(prefix.c_str(), access.dir_mode() & 0777) == 0) {
        UniqueFd made(::open(prefix.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        if (made.get() < 0) fail(prefix, errno, "open stage directory");
        give_access(made.get(), prefix, access.dir_mode(), access);
      } else if (!prefix.empty() && errno != EEXIST) {
        fail(prefix, errno, "create stage directory");
      }
      if (at == std::string::npos) break;
    }
    fd = UniqueFd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  }
  if (fd.get() < 0) fail(dir, errno, "open stage directory");
  struct stat st{};
  if (::fstat(fd.get(), &st) != 0) fail(dir, errno, "stat stage directory");
  // Shared like /tmp (sticky: only an entry's owner renames or removes it) is the normal case.
  if ((st.st_mode & S_IWOTH) != 0 && (st.st_mode & S_ISVTX) == 0) {
    refuse(dir, st,
           "any user can write it and its sticky bit is not set, so another user could rename the "
           "stage area in it and put their own in its place");
  }
  return fd;
}

UniqueFd open_private_dir(int parent, const std::string& name, const std::string& shown,
                          const StageAccess& access, bool* created) {
  const bool made = ::mkdirat(parent, name.c_str(), access.dir_mode() & 0777) == 0;
  if (!made && errno != EEXIST) fail(shown, errno, "create stage directory");
  if (created != nullptr) *created = made;
  UniqueFd fd(::openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  struct stat st{};
  if (fd.get() < 0) {
    const int err = errno;
    if (::fstatat(parent, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISDIR(st.st_mode)) {
      refuse(
          shown, st,
          S_ISLNK(st.st_mode) ? "it is a symbolic link, never followed" : "it is not a directory");
    }
    fail(shown, err, "open stage directory");
  }
  if (::fstat(fd.get(), &st) != 0) fail(shown, errno, "stat stage directory");
  if (made) {
    give_access(fd.get(), shown, access.dir_mode(), access);
    return fd;
  }
  const bool mine = st.st_uid == ::geteuid();
  const bool our_group = access.shared() && st.st_gid == access.group;
  if (!mine && !our_group) {
    refuse(shown, st,
           access.shared() ? "it belongs to another user and not to the stage group"
                           : "it belongs to another user, who could read or alter what is staged");
  }
  // Write access beyond the job's (its user; with a group, the group) lets others plant files.
  const mode_t writers = access.shared() ? S_IWOTH : (S_IWGRP | S_IWOTH);
  if ((st.st_mode & writers) != 0) {
    refuse(shown, st,
           "users other than the job's can write in it, and may have planted files there");
  }
  if (!mine && (st.st_mode & 07777 & ~access.dir_mode()) != 0) {
    refuse(shown, st, "it lets users outside the stage group read it");
  }
  if (mine && ((st.st_mode & 07777) != access.dir_mode() || (access.shared() && !our_group))) {
    // One of this user's made by an older version or under another umask: read access beyond the
    // job's is taken back. A read-only file system keeps what it has (nothing can be planted).
    try {
      give_access(fd.get(), shown, access.dir_mode(), access);
    } catch (const IoError& e) {
      if (e.error_code() != EROFS) throw;
    }
  }
  return fd;
}

int open_in(int dir, const char* name, int flags, const std::string& shown,
            const StageAccess& access) {
  // O_NONBLOCK: a FIFO planted under the name would otherwise hold the open until someone opened
  // its other end (for ever); it is refused below as any file but a regular one. Cleared once the
  // file is known to be regular.
  const int fd =
      ::openat(dir, name, flags | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, access.file_mode() & 0777);
  if (fd < 0) {
    const int err = errno;
    struct stat st{};
    if (err == ELOOP && ::fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
        S_ISLNK(st.st_mode)) {
      refuse(shown, st, "it is a symbolic link in the stage area, never followed", ELOOP);
    }
    errno = err;
    return -1;
  }
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    refuse(shown, st, "it is not a regular file");
  }
  if ((flags & O_NONBLOCK) == 0) {
    const int now = ::fcntl(fd, F_GETFL);
    if (now == -1 || ::fcntl(fd, F_SETFL, now & ~O_NONBLOCK) == -1) {
      const int err = errno;
      ::close(fd);
      errno = err;
      return -1;
    }
  }
  if ((flags & O_CREAT) != 0 && st.st_uid == ::geteuid() &&
      ((st.st_mode & 07777) != access.file_mode() ||
       (access.shared() && st.st_gid != access.group))) {
    try {
      give_access(fd, shown, access.file_mode(), access);
    } catch (const IoError& e) {
      if (e.error_code() != EROFS) {
        ::close(fd);
        throw;
      }
    }
  }
  return fd;
}

}  // namespace prestage::detail
