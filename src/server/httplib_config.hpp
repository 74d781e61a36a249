// cpp-httplib as Debian builds it (libcpp-httplib 0.11, compiled with OpenSSL, zlib and brotli support):
// the same macros must be set here, or the classes would not match the library's layout.
#pragma once

#define CPPHTTPLIB_OPENSSL_SUPPORT 1
#define CPPHTTPLIB_ZLIB_SUPPORT 1
#define CPPHTTPLIB_BROTLI_SUPPORT 1
#include <httplib.h>
