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

# --- libcrypto (required: the tcp transport's handshake (HMAC-SHA256, HKDF) and its frames'
# AEAD (AES-256-GCM / ChaCha20-Poly1305); OpenSSL's, from libssl-dev)
pkg_check_modules(CRYPTO REQUIRED IMPORTED_TARGET libcrypto)
message(STATUS "fleet: crypto  found: libcrypto ${CRYPTO_VERSION}")

# --- optional: MPI (mpi backend of the communicator)
find_package(MPI QUIET COMPONENTS C)
if(MPI_C_FOUND)
  message(STATUS "fleet: MPI     found: MPI ${MPI_C_VERSION} (${MPI_C_COMPILER}): mpi backend built")
else()
  message(STATUS "fleet: MPI     not found")
endif()

# --- optional: CUDA (the cuda backend: nvcc, cuBLAS and cuDNN) and NCCL.
# FLEET_CUDA=OFF builds without it. cuDNN and NCCL are looked up in the toolkit and the system,
# then where the Python wheels put them (nvidia-cudnn-cu13, nvidia-nccl-cu13:
# site-packages/nvidia/{cudnn,nccl}/{include,lib}) for every python3 found and the PyTorch
# venv of the GPU machines (/opt/torch/.venv); the wheels' lib may hold only libcudnn.so.9.
# Architectures: CMAKE_CUDA_ARCHITECTURES, unless set on the command line (e.g. "80;90;100"):
# those of the GPUs nvidia-smi lists, or 80 (A100; its PTX JIT-compiled on newer GPUs).
if(FL_SANITIZE AND NOT DEFINED FLEET_CUDA)
  # ASan and the CUDA driver disagree about the shadow gap (ASAN_OPTIONS=protect_shadow_gap=0);
  # sanitizer builds leave the backend out unless asked for
  set(FLEET_CUDA OFF CACHE BOOL "build the cuda backend when nvcc, cuBLAS and cuDNN are found")
endif()
option(FLEET_CUDA "build the cuda backend when nvcc, cuBLAS and cuDNN are found" ON)
set(FL_CUDA_FOUND OFF)
set(_fl_cuda_why "")
set(_fl_wheel_roots "")
find_program(FL_PYTHON3 NAMES python3)
foreach(_py ${FL_PYTHON3} /opt/torch/.venv/bin/python3)
  if(EXISTS ${_py})
    execute_process(COMMAND ${_py} -c
      "import site; print(';'.join(site.getsitepackages() + [site.getusersitepackages()]))"
      OUTPUT_VARIABLE _fl_sp OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _fl_rc)
    if(_fl_rc EQUAL 0)
      list(APPEND _fl_wheel_roots ${_fl_sp})
    endif()
  endif()
endforeach()
file(GLOB _fl_sp_globs /opt/torch/.venv/lib/python3*/site-packages /usr/local/lib/python3*/dist-packages
  /usr/lib/python3/dist-packages)
list(APPEND _fl_wheel_roots ${_fl_sp_globs})
list(REMOVE_DUPLICATES _fl_wheel_roots)
set(_fl_cudnn_inc_hints "")
set(_fl_cudnn_lib_hints "")
set(_fl_nccl_inc_hints "")
set(_fl_nccl_lib_hints "")
foreach(_root ${_fl_wheel_roots})
  list(APPEND _fl_cudnn_inc_hints ${_root}/nvidia/cudnn/include)
  list(APPEND _fl_cudnn_lib_hints ${_root}/nvidia/cudnn/lib)
  list(APPEND _fl_nccl_inc_hints ${_root}/nvidia/nccl/include)
  list(APPEND _fl_nccl_lib_hints ${_root}/nvidia/nccl/lib)
endforeach()

if(FLEET_CUDA)
  include(CheckLanguage)
  check_language(CUDA)
  if(NOT CMAKE_CUDA_COMPILER)
    set(_fl_cuda_why "nvcc not found")
  else()
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "")
      # the GPUs of this machine where nvidia-smi sees some ("9.0" -> 90), else sm_80 alone:
      # its PTX runs on every newer GPU through the driver's JIT (cached after the first
      # start), and a machine without a GPU builds to check the code, which one architecture
      # does at half the nvcc time of two (24 against 47 CPU-s)
      set(_fl_archs "")
      find_program(FL_NVIDIA_SMI nvidia-smi)
      if(FL_NVIDIA_SMI)
        execute_process(COMMAND ${FL_NVIDIA_SMI} --query-gpu=compute_cap --format=csv,noheader
          OUTPUT_VARIABLE _fl_caps RESULT_VARIABLE _fl_smi_rc ERROR_QUIET TIMEOUT 20)
        if(_fl_smi_rc EQUAL 0)
          string(REGEX MATCHALL "[0-9]+\\.[0-9]+" _fl_caps "${_fl_caps}")
          foreach(_cap ${_fl_caps})
            string(REPLACE "." "" _cap ${_cap})
            list(APPEND _fl_archs ${_cap})
          endforeach()
          list(REMOVE_DUPLICATES _fl_archs)
        endif()
      endif()
      if(NOT _fl_archs)
        set(_fl_archs 80)
      endif()
      set(CMAKE_CUDA_ARCHITECTURES "${_fl_archs}" CACHE STRING "GPU architectures of the cuda backend")
    endif()
    # one CUDA runtime, the shared one, for the library and everything linking it
    set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
    enable_language(CUDA)
    find_package(CUDAToolkit QUIET)
    if(NOT CUDAToolkit_FOUND OR NOT TARGET CUDA::cublas)
      set(_fl_cuda_why "nvcc found but not the CUDA toolkit with cuBLAS")
    else()
      find_path(FL_CUDNN_INC NAMES cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ${_fl_cudnn_inc_hints})
      find_library(FL_CUDNN_LIB NAMES cudnn libcudnn.so.9
        HINTS ${CUDAToolkit_LIBRARY_DIR} ${_fl_cudnn_lib_hints})
      if(FL_CUDNN_INC AND FL_CUDNN_LIB)
        set(FL_CUDA_FOUND ON)
        get_filename_component(FL_CUDNN_LIB_DIR ${FL_CUDNN_LIB} DIRECTORY)
      else()
        set(_fl_cuda_why "CUDA ${CUDAToolkit_VERSION} found but not cuDNN (nvidia-cudnn-cu13 or the system's libcudnn9)")
      endif()
    endif()
  endif()
endif()
if(FL_CUDA_FOUND)
  message(STATUS "fleet: CUDA    found: ${CUDAToolkit_VERSION}, cuDNN ${FL_CUDNN_LIB}, sm ${CMAKE_CUDA_ARCHITECTURES}: cuda backend built")
elseif(NOT FLEET_CUDA AND FL_SANITIZE)
  message(STATUS "fleet: CUDA    off (sanitizer build; -DFLEET_CUDA=ON builds it anyway): cuda backend not built")
elseif(NOT FLEET_CUDA)
  message(STATUS "fleet: CUDA    off (FLEET_CUDA=OFF): cuda backend not built")
else()
  message(STATUS "fleet: CUDA    not found: ${_fl_cuda_why}: cuda backend not built")
endif()
# NCCL (the nccl backend of the communicator, src/comm/nccl.c): needs the cuda backend (the
# rank's GPU, its compute stream) and nccl.h + libnccl, 2.14 or newer. FLEET_NCCL=OFF leaves
# it out.
option(FLEET_NCCL "build the nccl comm backend when CUDA and NCCL are found" ON)
set(FL_NCCL_FOUND OFF)
find_library(FL_NCCL_LIB NAMES nccl libnccl.so.2 HINTS ${CUDAToolkit_LIBRARY_DIR} ${_fl_nccl_lib_hints})
find_path(FL_NCCL_INC NAMES nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ${_fl_nccl_inc_hints})
if(FL_NCCL_LIB AND FL_NCCL_INC AND FL_CUDA_FOUND AND FLEET_NCCL)
  set(FL_NCCL_FOUND ON)
  get_filename_component(FL_NCCL_LIB_DIR ${FL_NCCL_LIB} DIRECTORY)
  message(STATUS "fleet: NCCL    found: ${FL_NCCL_LIB}: nccl backend built")
elseif(FL_NCCL_LIB AND FL_NCCL_INC AND NOT FLEET_NCCL)
  message(STATUS "fleet: NCCL    off (FLEET_NCCL=OFF): nccl backend not built")
elseif(FL_NCCL_LIB AND FL_NCCL_INC)
  message(STATUS "fleet: NCCL    found: ${FL_NCCL_LIB}, but not the cuda backend: nccl backend not built")
elseif(FL_NCCL_LIB)
  message(STATUS "fleet: NCCL    found: ${FL_NCCL_LIB}, but not nccl.h: nccl backend not built")
else()
  message(STATUS "fleet: NCCL    not found: nccl backend not built")
endif()
