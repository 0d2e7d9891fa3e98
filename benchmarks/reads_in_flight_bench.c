// Reads in flight: blocking threads against io_uring, for the decision behind stage 2's reads
// (issue "Fast with no knobs", item 4). Reads every file named on stdin (one path and its size per
// line) with one open, one read of the known size and one close each, keeping N files in flight:
//   threads N   N threads, each a blocking openat/pread/close at a time (what the stager does);
//   uring N     one thread, an io_uring with N files in flight (openat -> read -> close chained by
//               completions), raw system calls (no liburing needed).
// Prints files/s. Build: cc -O2 -o reads_in_flight_bench reads_in_flight_bench.c -lpthread
// Run by benchmarks/reads_in_flight_bench.py over the emulated parallel file system.
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/io_uring.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

typedef struct {
  char* path;
  size_t size;
} File;

static File* files;
static size_t nfiles;
static atomic_size_t next_file;
static size_t max_size;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void* reader(void* arg) {
  (void)arg;
  char* buffer = malloc(max_size + 1);
  for (;;) {
    const size_t i = atomic_fetch_add(&next_file, 1);
    if (i >= nfiles) break;
    const int fd = open(files[i].path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || pread(fd, buffer, files[i].size + 1, 0) != (ssize_t)files[i].size) {
      fprintf(stderr, "cannot read %s\n", files[i].path);
      exit(1);
    }
    close(fd);
  }
  free(buffer);
  return NULL;
}

static void run_threads(int n) {
  pthread_t* t = calloc(n, sizeof(pthread_t));
  for (int i = 0; i < n; ++i) pthread_create(&t[i], NULL, reader, NULL);
  for (int i = 0; i < n; ++i) pthread_join(t[i], NULL);
  free(t);
}

// One io_uring, its rings mapped.
typedef struct {
  int fd;
  unsigned *sq_tail, *sq_mask, *sq_array, *cq_head, *cq_tail, *cq_mask;
  struct io_uring_sqe* sqes;
  struct io_uring_cqe* cqes;
} Ring;

static void ring_init(Ring* r, unsigned entries) {
  struct io_uring_params p;
  memset(&p, 0, sizeof(p));
  r->fd = (int)syscall(__NR_io_uring_setup, entries, &p);
  if (r->fd < 0) {
    perror("io_uring_setup");
    exit(2);
  }
  const size_t sq_len = p.sq_off.array + p.sq_entries * sizeof(unsigned);
  const size_t cq_len = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
  char* sq = mmap(NULL, sq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd,
                  IORING_OFF_SQ_RING);
  char* cq = mmap(NULL, cq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd,
                  IORING_OFF_CQ_RING);
  r->sqes = mmap(NULL, p.sq_entries * sizeof(struct io_uring_sqe), PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_POPULATE, r->fd, IORING_OFF_SQES);
  r->sq_tail = (unsigned*)(sq + p.sq_off.tail);
  r->sq_mask = (unsigned*)(sq + p.sq_off.ring_mask);
  r->sq_array = (unsigned*)(sq + p.sq_off.array);
  r->cq_head = (unsigned*)(cq + p.cq_off.head);
  r->cq_tail = (unsigned*)(cq + p.cq_off.tail);
  r->cq_mask = (unsigned*)(cq + p.cq_off.ring_mask);
  r->cqes = (struct io_uring_cqe*)(cq + p.cq_off.cqes);
}

static void push(Ring* r, const struct io_uring_sqe* sqe) {
  const unsigned tail = *r->sq_tail;
  const unsigned index = tail & *r->sq_mask;
  r->sqes[index] = *sqe;
  r->sq_array[index] = index;
  __atomic_store_n(r->sq_tail, tail + 1, __ATOMIC_RELEASE);
}

// Slot states: opening, reading, closing. user_data = slot index.
typedef struct {
  size_t file;
  int fd;
  int stage;
  char* buffer;
} Slot;

static void start(Ring* r, Slot* s, unsigned slot) {
  struct io_uring_sqe sqe;
  memset(&sqe, 0, sizeof(sqe));
  sqe.user_data = slot;
  sqe.flags = IOSQE_ASYNC;  // straight to io_uring's workers: a FUSE open or read would block the submitter
  if (s->stage == 0) {
    sqe.opcode = IORING_OP_OPENAT;
    sqe.fd = AT_FDCWD;
    sqe.addr = (uint64_t)(uintptr_t)files[s->file].path;
    sqe.open_flags = O_RDONLY | O_CLOEXEC;
  } else if (s->stage == 1) {
    sqe.opcode = IORING_OP_READ;
    sqe.fd = s->fd;
    sqe.addr = (uint64_t)(uintptr_t)s->buffer;
    sqe.len = (unsigned)files[s->file].size + 1;
    sqe.off = 0;
  } else {
    sqe.opcode = IORING_OP_CLOSE;
    sqe.fd = s->fd;
  }
  push(r, &sqe);
}

static void run_uring(int n) {
  Ring r;
  ring_init(&r, (unsigned)(n < 4096 ? n * 2 : 8192));
  Slot* slots = calloc(n, sizeof(Slot));
  size_t issued = 0, done = 0;
  unsigned to_submit = 0;
  for (int i = 0; i < n && issued < nfiles; ++i) {
    slots[i] = (Slot){issued++, -1, 0, malloc(max_size + 1)};
    start(&r, &slots[i], (unsigned)i);
    ++to_submit;
  }
  while (done < nfiles) {
    if (syscall(__NR_io_uring_enter, r.fd, to_submit, 1, IORING_ENTER_GETEVENTS, NULL, 0) < 0) {
      perror("io_uring_enter");
      exit(2);
    }
    to_submit = 0;
    unsigned head = *r.cq_head;
    const unsigned tail = __atomic_load_n(r.cq_tail, __ATOMIC_ACQUIRE);
    for (; head != tail; ++head) {
      const struct io_uring_cqe* c = &r.cqes[head & *r.cq_mask];
      Slot* s = &slots[c->user_data];
      if (s->stage == 0) {
        if (c->res < 0) {
          fprintf(stderr, "open %s: %s\n", files[s->file].path, strerror(-c->res));
          exit(1);
        }
        s->fd = c->res;
        s->stage = 1;
      } else if (s->stage == 1) {
        if (c->res != (int)files[s->file].size) {
          fprintf(stderr, "read %s: %d\n", files[s->file].path, c->res);
          exit(1);
        }
        s->stage = 2;
      } else {
        ++done;
        if (issued == nfiles) continue;
        s->file = issued++;
        s->stage = 0;
      }
      start(&r, s, (unsigned)c->user_data);
      ++to_submit;
    }
    __atomic_store_n(r.cq_head, head, __ATOMIC_RELEASE);
  }
}

int main(int argc, char** argv) {
  if (argc != 3 || (strcmp(argv[1], "threads") != 0 && strcmp(argv[1], "uring") != 0)) {
    fprintf(stderr, "usage: %s threads|uring N < 'path size' lines\n", argv[0]);
    return 2;
  }
  const int n = atoi(argv[2]);
  size_t cap = 1024;
  files = malloc(cap * sizeof(File));
  char path[4096];
  size_t size;
  while (scanf("%4095s %zu", path, &size) == 2) {
    if (nfiles == cap) files = realloc(files, (cap *= 2) * sizeof(File));
    files[nfiles++] = (File){strdup(path), size};
    if (size > max_size) max_size = size;
  }
  const double t0 = now();
  if (argv[1][0] == 't') {
    run_threads(n);
  } else {
    run_uring(n);
  }
  const double s = now() - t0;
  printf("{\"mode\": \"%s\", \"in_flight\": %d, \"files\": %zu, \"seconds\": %.3f, \"files_per_s\": %.1f}\n",
         argv[1], n, nfiles, s, nfiles / s);
  return 0;
}
