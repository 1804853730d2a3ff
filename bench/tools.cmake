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
    add_test(NAME python_cli COMMAND ${VMMARENA_PYTHON} -m unittest -v test_stat test_memviz
      WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}/tests/python)
    set_tests_properties(python_cli PROPERTIES ENVIRONMENT "${cli_env}" TIMEOUT 300)
  endif()
endif()
