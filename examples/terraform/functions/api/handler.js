exports.handle = async (event) => ({
  service: "api",
  path: event.path || "/",
});
