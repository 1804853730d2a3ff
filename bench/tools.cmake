# The tools are the Python package's command line (`python3 -m vmmarena stat|memviz`,
# shim/python/vmmarena/_cli.py); their tests run here.
if(VMMARENA_TESTS)
  find_program(VMMARENA_PYTHON NAMES python3 HINTS /usr/bin DOC "python3 that runs the Python tests")
  if(VMMARENA_PYTHON)
    enable_testing()
    set(cli_env "PYTHONPATH=${PROJECT_SOURCE_DIR}/shim/python" "PYTHONDONTWRITEBYTECODE=1")
    if(VMMARENA_SHIM AND NOT VMMARENA_SANITIZE)  # the live snapshot case loads the shim
      list(APPEND cli_env "VMMARENA_LIBRARY=$<TARGET_FILE:vmmarena_torch>"
        "VMMARENA_FAKE_DRIVER=$<TARGET_FILE:vmmarena_fake_driver>")
    endif()
    add_test(NAME python_cli COMMAND ${VMMARENA_PYTHON} -m unittest -v test_cli test_stat test_memviz
      WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}/tests/python)
    set_tests_properties(python_cli PROPERTIES ENVIRONMENT "${cli_env}" TIMEOUT 300)
    # The C tools' --help, --version and unknown options (tests/python/test_tool_options.py):
    # every tool this directory builds by default, with the CUDA stub for those that link libcuda.
    set(tools "vmmarena-replay=$<TARGET_FILE:vmmarena-replay>")
    foreach(src ${VMMARENA_BENCH_SOURCES})
      get_filename_component(name ${src} NAME_WE)
      get_target_property(excluded ${name} EXCLUDE_FROM_ALL)
      if(NOT excluded)
        list(APPEND tools "${name}=$<TARGET_FILE:${name}>")
      endif()
    endforeach()
    string(REPLACE ";" "\\;" tools "${tools}")
    set(tools_env "VMMARENA_TOOLS=${tools}" "PYTHONDONTWRITEBYTECODE=1")
    if(TARGET CUDA::cuda_driver)
      list(APPEND tools_env "VMMARENA_CUDA_STUB=$<TARGET_FILE:CUDA::cuda_driver>")
    endif()
    add_test(NAME tool_options COMMAND ${VMMARENA_PYTHON} -m unittest -v test_tool_options
      WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}/tests/python)
    set_tests_properties(tool_options PROPERTIES ENVIRONMENT "${tools_env}" TIMEOUT 120)
  endif()
endif()
