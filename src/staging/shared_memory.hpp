// shared_memory.hpp: staging memory that other processes can map, made safe to touch.
//
// create_shared_memory makes an unnamed shared-memory file (O_TMPFILE in /dev/shm, mode 0600;
// memfd where that is impossible), refusing at once when /dev/shm plainly lacks the bytes.
// prepare_memory then allocates and maps every page of a mapping inside the kernel
// (MADV_POPULATE_WRITE, several threads), so a /dev/shm that fills up is an error naming
// it, its size and the bytes needed, never a SIGBUS at a later write. Neither changes a byte.
#pragma once

#include <cstddef>
#include <string>

#include "core/status.hpp"

namespace hostreg {

// The directory staging memory is made in: HOSTREG_SHM_DIR if set (it must be an absolute
// path to an existing tmpfs, ramfs or hugetlbfs directory, else 1 naming the variable and the
// cause), else /dev/shm.
Status shared_memory_dir(std::string* dir);

// An unnamed file of `bytes` bytes in shared_memory_dir(); *fd (close-on-exec) is the
// caller's. 1 for 0 bytes or a NULL fd, 2 when the directory lacks the space or the file
// cannot be made; nothing is left behind on failure.
Status create_shared_memory(size_t bytes, int* fd);

// Whether create_shared_memory(bytes) would find the room: 2 when shared_memory_dir() has
// fewer than `bytes` free (the same words create_shared_memory gives), 1 for a bad
// HOSTREG_SHM_DIR, else ok. Makes nothing.
Status shared_memory_room(size_t bytes);

// Allocates every page of [ptr, ptr + bytes) without changing a byte. fd (>= 0): the file the
// range maps, named in the message when its filesystem is full. 1 for an empty, wrapping or
// unmapped range; 2 when memory runs out.
Status prepare_memory(void* ptr, size_t bytes, int fd);

}  // namespace hostreg
