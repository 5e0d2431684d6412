// The libnfs headers, in the order they must be included (libnfs.h defines
// EXTERN for the raw headers). Include only from src/nfs/.
#pragma once

// clang-format off
#include <nfsc/libnfs.h>
#include <nfsc/libnfs-raw.h>
#include <nfsc/libnfs-raw-mount.h>
#include <nfsc/libnfs-raw-nfs.h>
// clang-format on
