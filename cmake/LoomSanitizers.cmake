# LOOM_SANITIZE=address,undefined or thread: applied to every target.
if(LOOM_SANITIZE)
  add_compile_options(-fsanitize=${LOOM_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  add_link_options(-fsanitize=${LOOM_SANITIZE})
endif()
