# HICOLL_SANITIZE=address,undefined or =thread builds everything with those sanitizers (the
# sanitizer tier of scripts/sanitize.sh). Errors abort: a test that hits one fails.
set(HICOLL_SANITIZE "" CACHE STRING "Sanitizers to build with (address,undefined | thread | empty)")
if(HICOLL_SANITIZE)
  add_compile_options(-fsanitize=${HICOLL_SANITIZE} -fno-sanitize-recover=all -fno-omit-frame-pointer)
  add_link_options(-fsanitize=${HICOLL_SANITIZE})
  message(STATUS "hicoll: sanitizers ${HICOLL_SANITIZE}")
endif()
