# features.cmake - find required libraries (OpenBLAS, libyaml, OpenMP) and detect optional ones
# (MPI, CUDA, NCCL), printing one line per feature, found or not.

include(GNUInstallDirs)
find_package(PkgConfig REQUIRED)

# --- BLAS: prefer Debian's OpenMP build of OpenBLAS, so BLAS and fleet's own OpenMP kernels
# share one thread pool instead of two pools spinning against each other on few cores.
set(FL_BLAS_NAME "")
if(CMAKE_LIBRARY_ARCHITECTURE)
  set(_fl_arch ${CMAKE_LIBRARY_ARCHITECTURE})
else()
  execute_process(COMMAND gcc -print-multiarch OUTPUT_VARIABLE _fl_arch OUTPUT_STRIP_TRAILING_WHITESPACE)
endif()
find_library(FL_OPENBLAS_LIB NAMES openblas
  PATHS /usr/lib/${_fl_arch}/openblas-openmp NO_DEFAULT_PATH)
find_path(FL_OPENBLAS_INC NAMES cblas.h
  PATHS /usr/include/${_fl_arch}/openblas-openmp NO_DEFAULT_PATH)
if(FL_OPENBLAS_LIB AND FL_OPENBLAS_INC)
  set(FL_BLAS_NAME "OpenBLAS (OpenMP)")
else()
  unset(FL_OPENBLAS_LIB CACHE)
  unset(FL_OPENBLAS_INC CACHE)
  find_library(FL_OPENBLAS_LIB NAMES openblas)
  find_path(FL_OPENBLAS_INC NAMES cblas.h PATH_SUFFIXES openblas ${_fl_arch}/openblas-pthread)
  if(FL_OPENBLAS_LIB AND FL_OPENBLAS_INC)
    set(FL_BLAS_NAME "OpenBLAS")
  endif()
endif()
if(NOT FL_BLAS_NAME)
  message(FATAL_ERROR "fleet: OpenBLAS not found; run scripts/install-deps.sh (apt-get install libopenblas-openmp-dev)")
endif()
message(STATUS "fleet: BLAS    found: ${FL_BLAS_NAME} ${FL_OPENBLAS_LIB}")

# --- OpenMP (required: elementwise kernels)
find_package(OpenMP REQUIRED COMPONENTS C)
message(STATUS "fleet: OpenMP  found: ${OpenMP_C_SPEC_DATE}")

# --- libyaml (required: configs)
pkg_check_modules(YAML REQUIRED IMPORTED_TARGET yaml-0.1)
message(STATUS "fleet: YAML    found: libyaml ${YAML_VERSION}")

# --- libjpeg (required: the image-list dataset decodes JPEG). Debian's libjpeg62-turbo-dev
# provides libjpeg.pc; libjpeg-turbo is what makes decoding fast (SIMD IDCT, DCT scaling).
pkg_check_modules(JPEG REQUIRED IMPORTED_TARGET libjpeg)
message(STATUS "fleet: JPEG    found: libjpeg ${JPEG_VERSION}")

# --- oneDNN (optional: the onednn backend's convolution, batch norm and pooling). Debian's
# libdnnl-dev (2.x, OpenMP runtime) has no pkg-config file: header and library are looked up.
# FLEET_ONEDNN=OFF builds without it (the cpu backend's im2col path then runs everything).
option(FLEET_ONEDNN "build the onednn backend when oneDNN is found" ON)
set(FL_ONEDNN_FOUND OFF)
if(FLEET_ONEDNN)
  find_path(FL_DNNL_INC NAMES oneapi/dnnl/dnnl.h)
  find_library(FL_DNNL_LIB NAMES dnnl)
  if(FL_DNNL_INC AND FL_DNNL_LIB)
    set(FL_ONEDNN_FOUND ON)
  endif()
endif()
if(FL_ONEDNN_FOUND)
  message(STATUS "fleet: oneDNN  found: ${FL_DNNL_LIB}: onednn backend built")
elseif(NOT FLEET_ONEDNN)
  message(STATUS "fleet: oneDNN  off (FLEET_ONEDNN=OFF): onednn backend not built")
else()
  message(STATUS "fleet: oneDNN  not found: onednn backend not built (libdnnl-dev)")
endif()

# --- zlib (required: gzip-compressed IDX files of MNIST-format sets; checkpoint checksums)
pkg_check_modules(ZLIB REQUIRED IMPORTED_TARGET zlib)
message(STATUS "fleet: zlib    found: zlib ${ZLIB_VERSION}")

# --- optional: MPI (mpi backend of the communicator)
find_package(MPI QUIET COMPONENTS C)
if(MPI_C_FOUND)
  message(STATUS "fleet: MPI     found: MPI ${MPI_C_VERSION} (${MPI_C_COMPILER}): mpi backend built")
else()
  message(STATUS "fleet: MPI     not found")
endif()

# --- optional: CUDA and NCCL (GPU kernels and backend)
include(CheckLanguage)
check_language(CUDA)
find_package(CUDAToolkit QUIET)
if(CMAKE_CUDA_COMPILER AND CUDAToolkit_FOUND)
  message(STATUS "fleet: CUDA    found: ${CUDAToolkit_VERSION} (GPU kernels not built yet)")
else()
  message(STATUS "fleet: CUDA    not found")
endif()
find_library(FL_NCCL_LIB NAMES nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
if(FL_NCCL_LIB)
  message(STATUS "fleet: NCCL    found: ${FL_NCCL_LIB} (nccl backend not built yet)")
else()
  message(STATUS "fleet: NCCL    not found")
endif()
