// A minimal sless function: greets whoever is named in the request.
exports.handle = async (event) => {
  const body = event && event.method ? event.body : event;
  const name = (body && typeof body === 'object' && body.name) || 'world';
  console.log(`greeting ${name}`);
  return { message: `Hello, ${name}!` };
};
